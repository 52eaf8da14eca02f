"""The hand-written text of the protocol's prompt set (scripts/make_protocol_prompts.py): templates,
fillers and follow-up turns for the categories the shipped prompt sets do not cover.

Each template carries its difficulty (the rule the datasheet states: "easy" asks for one fact or
one step, "medium" for an explanation or two to three steps, "hard" for a multi-step answer,
a comparison or an argued text). Nothing here is drawn at random: the builder combines these
lists with a seeded generator, so the output is the same on every machine.
"""

from __future__ import annotations

# --- STEM: explanations (fillers) and calculations (numbers from the seeded generator) --------

STEM_EXPLAIN = (
    ("easy", "In two or three sentences, what is {x}?"),
    ("medium", "Explain how {x} works, step by step, for a high-school student."),
    ("hard", "Explain {x}, then describe one experiment or observation that supports it."),
)
STEM_TOPICS = (
    "photosynthesis", "the greenhouse effect", "natural selection", "an electric motor",
    "the water cycle", "radioactive decay", "a vaccine", "plate tectonics", "the Doppler effect",
    "osmosis", "a transistor", "the conservation of momentum",
)  # fmt: skip
# (difficulty, template, how the numbers are drawn): a, b from the generator's ranges below.
STEM_CALC = (
    ("easy", "A car travels {a} km in {b} hours at a constant speed. What is its speed in km/h?"),
    (
        "medium",
        "A ball is dropped from rest from a height of {a} m. Ignoring air resistance and taking "
        "g = 9.8 m/s^2, how long does it take to reach the ground, and how fast is it moving then?",
    ),
    (
        "medium",
        "How many moles of water are in {a} g of water (molar mass 18.02 g/mol), and how many molecules is that?",
    ),
    (
        "hard",
        "A {a} ohm resistor and a {b} ohm resistor are connected in parallel to a 12 V battery. "
        "What is the equivalent resistance, the total current, and the current through each resistor?",
    ),
)

# --- Reasoning: ordering, syllogisms, sequences, scheduling -----------------------------------

NAMES = (
    "Alice", "Bruno", "Chen", "Dalia", "Emeka", "Farah", "Goran", "Hana", "Ivan", "Jade", "Kofi",
    "Lena", "Mateo", "Nadia", "Omar", "Priya",
)  # fmt: skip
SYLLOGISMS = (  # (difficulty, premises and question): the answer follows, or does not, by form
    ("medium", "All {x} are {y}. All {y} are {z}. Does it follow that all {x} are {z}? Explain your reasoning."),
    ("hard", "All {x} are {y}. Some {y} are {z}. Does it follow that some {x} are {z}? Explain your reasoning."),
    ("hard", "No {x} are {y}. Some {z} are {x}. What, if anything, follows about {z} and {y}? Explain."),
)
SYLLOGISM_TERMS = (
    ("roses", "flowers", "plants"), ("sparrows", "birds", "animals"), ("violins", "string instruments",
    "musical instruments"), ("squares", "rectangles", "polygons"), ("trout", "fish", "vertebrates"),
    ("sedans", "cars", "vehicles"),
)  # fmt: skip

# --- Humanities: history, philosophy, literature, art -----------------------------------------

HUMANITIES = (
    ("easy", "Who was {p}, and why is this person remembered?"),
    ("medium", "Summarize the main causes of {e}."),
    ("medium", "What is the central theme of {w}? Refer to the plot in your answer."),
    ("hard", "Compare the views of {a} and {b} on {t}. Where do they agree, and where do they differ?"),
)
PEOPLE = (
    "Hypatia of Alexandria", "Ibn Battuta", "Mary Wollstonecraft", "Simón Bolívar", "Murasaki Shikibu",
    "Frederick Douglass", "Hildegard of Bingen", "Mansa Musa",
)  # fmt: skip
EVENTS = (
    "the French Revolution", "the fall of the Western Roman Empire", "the First World War",
    "the Protestant Reformation", "the collapse of the Soviet Union", "the American Civil War",
    "the Industrial Revolution in Britain",
)  # fmt: skip
WORKS = (
    "Homer's Odyssey", "Mary Shelley's Frankenstein", "Chinua Achebe's Things Fall Apart",
    "Shakespeare's Macbeth", "George Orwell's Animal Farm", "Cervantes' Don Quixote",
    "Sophocles' Antigone",
)  # fmt: skip
COMPARISONS = (
    ("Plato", "Aristotle", "the nature of knowledge"), ("Hobbes", "Locke", "the state of nature"),
    ("Kant", "John Stuart Mill", "what makes an action right"), ("Confucius", "Laozi", "how to govern well"),
    ("Rousseau", "Voltaire", "civilisation and progress"), ("Descartes", "Hume", "where knowledge comes from"),
)  # fmt: skip

# --- Writing: forms and topics that the training set's writing prompts do not use -------------

WRITING_FORMS = (
    ("easy", "Write a short diary entry about {t}."),
    ("easy", "Write three haiku about {t}."),
    ("medium", "Write a product description (about 100 words) for a gadget that helps with {t}."),
    ("medium", "Write a news headline and a short opening paragraph about {t}."),
    ("hard", "Write the opening paragraph of a mystery novel that begins with {t}, ending on a question."),
    ("hard", "Write a persuasive letter to a town council about {t}, with three arguments and a closing request."),
)
WRITING_TOPICS = (
    "a flooded basement", "a lost passport", "a village without internet", "a stolen painting",
    "a night-time bicycle ride", "an abandoned greenhouse", "a rooftop beehive", "a broken elevator",
    "a pottery class", "a street without cars", "a found diary", "a local radio station",
)  # fmt: skip

# --- Roleplay: a character, a situation and the user's first line -----------------------------

ROLEPLAY = (
    ("easy", "a cheerful tour guide in Lisbon", "A tourist has just joined your walking tour.",
     "Hi! What will we see first?"),
    ("easy", "a patient barista", "It is a busy Monday morning.",
     "I can't decide what to order. What do you recommend?"),
    ("easy", "a friendly librarian", "A child comes to your desk.", "Do you have books about dinosaurs?"),
    ("medium", "a ship's captain in 1850", "A storm is coming and the crew is worried.",
     "Captain, should we turn back to port?"),
    ("medium", "a detective questioning a witness", "A painting was stolen from a gallery last night.",
     "I already told the police everything I saw."),
    ("medium", "a personal trainer", "A client is starting their first week of training.",
     "I have never exercised before. Where do I start?"),
    ("medium", "a medieval blacksmith", "A young apprentice has come to learn the trade.",
     "Master, why do you plunge the hot iron into water?"),
    ("hard", "a diplomat negotiating a trade deal", "The other side has just rejected your first offer.",
     "Your terms are unacceptable. Why should we accept any of this?"),
    ("hard", "a museum guide speaking as Leonardo da Vinci", "Visitors stand in front of your notebooks.",
     "Which of your inventions are you proudest of, and why?"),
    ("hard", "a customer-support agent for an internet provider", "The customer's connection has failed "
     "three times this week.", "This is the third outage. I want a refund, now."),
    ("medium", "a park ranger", "Hikers stop you at the trailhead.", "Is it safe to hike to the lake today?"),
    ("easy", "a baker in a small French village", "A customer walks in just before closing.",
     "Is there any bread left? What would you suggest?"),
    ("easy", "a zookeeper", "A school group stops at the penguin enclosure.", "Why do penguins not fly?"),
    ("medium", "a travel agent", "A couple wants a two-week holiday on a small budget.",
     "We love mountains and good food. Where should we go?"),
    ("medium", "an astronaut on the International Space Station", "A student is talking to you over a radio link.",
     "What is the hardest part of living in space?"),
    ("medium", "a restaurant critic", "A chef asks for your honest opinion of the meal you just ate.",
     "So, what did you think of the soup?"),
    ("hard", "a job interviewer for a software company", "The candidate has just sat down.",
     "Thanks for having me. What does a typical day in this role look like?"),
    ("hard", "a ghost haunting an old castle", "A nervous visitor has stayed after the last tour.",
     "Who are you, and why are you still here?"),
    ("hard", "a judge in a baking competition", "A contestant's cake has collapsed in the oven.",
     "Please, can I have five more minutes to fix it?"),
    ("hard", "a chess coach", "Your student just lost a game in twelve moves.",
     "I keep losing in the opening. What am I doing wrong?"),
)  # fmt: skip
ROLEPLAY_FOLLOW_UPS = ("That sounds good. What should I do next?", "Hmm, I'm not convinced. Can you tell me more?")
ROLEPLAY_LAST = "Thank you! One last question: what would you do in my place?"  # the third turn, when there is one

# --- Multilingual: written in each language, templates x fillers -------------------------------

MULTILINGUAL = {
    "French": (
        (
            "easy",
            "Donne trois conseils pour {x}.",
            ("apprendre une langue étrangère", "mieux dormir", "économiser de l'argent", "cuisiner plus souvent"),
        ),
        (
            "medium",
            "Explique en quelques phrases pourquoi {x}.",
            ("le ciel est bleu", "les feuilles changent de couleur en automne", "la mer est salée"),
        ),
        (
            "hard",
            "Rédige un court texte argumentatif pour ou contre {x}.",
            ("la semaine de quatre jours", "l'interdiction des voitures en centre-ville"),
        ),
    ),
    "Spanish": (
        (
            "easy",
            "Dame tres consejos para {x}.",
            ("aprender a tocar la guitarra", "organizar mejor el tiempo", "cuidar las plantas de casa"),
        ),
        (
            "medium",
            "Explica en pocas frases por qué {x}.",
            ("el cielo es azul", "los volcanes entran en erupción", "la luna tiene fases"),
        ),
        (
            "hard",
            "Escribe un texto breve a favor o en contra de {x}.",
            ("los deberes escolares", "trabajar desde casa"),
        ),
    ),
    "German": (
        ("easy", "Gib drei Tipps, wie man {x}.", ("besser schläft", "eine Fremdsprache lernt", "Geld spart")),
        (
            "medium",
            "Erkläre in wenigen Sätzen, warum {x}.",
            ("der Himmel blau ist", "es im Winter kälter ist als im Sommer", "Brot beim Backen aufgeht"),
        ),
        (
            "hard",
            "Schreibe einen kurzen Text, der für oder gegen {x} argumentiert.",
            ("ein Tempolimit auf Autobahnen", "die Viertagewoche"),
        ),
    ),
    "Italian": (
        (
            "easy",
            "Dammi tre consigli per {x}.",
            ("imparare una lingua straniera", "dormire meglio", "risparmiare denaro"),
        ),
        (
            "medium",
            "Spiega in poche frasi perché {x}.",
            ("il cielo è blu", "le foglie cadono in autunno", "il mare è salato"),
        ),
        (
            "hard",
            "Scrivi un breve testo in cui prendi posizione su questo tema: {x}.",
            ("la settimana lavorativa di quattro giorni", "l'uso dello smartphone a scuola"),
        ),
    ),
    "Portuguese": (
        ("easy", "Dê três dicas para {x}.", ("aprender uma língua estrangeira", "dormir melhor", "poupar dinheiro")),
        (
            "medium",
            "Explique em poucas frases por que {x}.",
            ("o céu é azul", "as marés sobem e descem", "o pão cresce no forno"),
        ),
        (
            "hard",
            "Escreva um texto curto a favor ou contra {x}.",
            ("a semana de quatro dias", "o uso de celulares nas escolas"),
        ),
    ),
}
MULTILINGUAL_FOLLOW_UPS = {
    "French": "Peux-tu résumer ta réponse en une phrase ?",
    "Spanish": "¿Puedes resumir tu respuesta en una sola frase?",
    "German": "Kannst du deine Antwort in einem Satz zusammenfassen?",
    "Italian": "Puoi riassumere la tua risposta in una sola frase?",
    "Portuguese": "Você pode resumir sua resposta em uma frase?",
}

# --- RAG: sections of the Python language reference (pydoc_data.topics, shipped with Python),
# each with a question its first part answers and a phrase that must appear in the passage
# (the builder checks it, so every question stays answerable from the cut passage).
RAG = (
    ("assert", "What is the extended form of the assert statement equivalent to?", "AssertionError(expression2)"),
    ("break", "Where may a break statement occur, and what happens to a finally clause when break leaves "
     "a try statement?", "finally"),
    ("continue", "What does the continue statement do, and where may it appear?", "next cycle"),
    ("del", "What happens when you delete a name that is not bound?", "NameError"),
    ("for", "When is the else clause of a for loop executed?", "else"),
    ("global", "What restrictions apply to names listed in a global statement?", "must not"),
    ("if", "How does the if statement decide which suite to execute?", "true"),
    ("lambda", "What does a lambda expression create, and what can its body not contain?", "anonymous"),
    ("pass", "When is the pass statement useful?", "syntactically"),
    ("return", "What happens when return passes control out of a try statement with a finally clause?",
     "finally"),
    ("while", "When is the else clause of a while loop executed, and when is it skipped?", "break"),
    ("with", "Which steps does the execution of a with statement with one item go through?", "__enter__()"),
    ("yield", "Where may a yield expression be used, and what does using one in a function body do?",
     "generator"),
    ("nonlocal", "Which variables can the nonlocal statement refer to?", "enclosing"),
    ("truth", "Which built-in objects are considered false?", "None"),
    ("booleans", "What do the operators and and or return?", "returns"),
    ("integers", "Is there a limit to the length of an integer literal?", "no limit"),
    ("floating", "Are underscores allowed in floating-point literals, and what are they for?", "Underscores"),
    ("slicings", "What does a slicing select?", "slicing selects"),
    ("dict", "What happens when the same key is given more than once in a dictionary display?", "last"),
    ("context-managers", "Which two methods does a context manager define?", "__exit__"),
    ("typesmodules", "What special operation do modules support, and what is a module's __dict__?",
     "__dict__"),
    ("atom-identifiers", "What is private name mangling, and when does it apply?", "mangling"),
    ("exceptions", "What happens when an exception is not handled at all?", "terminates"),
    ("raise", "What does raise do when it is given no expression?", "re-raises"),
    ("lists", "How is a list display written, and what does it yield?", "list display"),
)  # fmt: skip

# --- Follow-up turns (a second user turn for a quarter of the records, by hash) ---------------

FOLLOW_UPS = {
    "coding": "Now add a docstring with one usage example.",
    "math": "Can you check the answer with a different method?",
    "stem": "Give one everyday example of this.",
    "reasoning": "Now explain your reasoning to someone who finds puzzles hard.",
    "qa": "Which sentence of the passage supports your answer?",
    "rag": "Quote the part of the passage your answer relies on.",
    "humanities": "What is one common misconception about this?",
    "writing": "Rewrite it in a more humorous tone.",
    "summarization": "Now turn your summary into three bullet points.",
}
