"""Tool-use chats (OpenAI "tool_calls", tool turns and "tools"; ShareGPT "observation") in user
datasets and `specjax regenerate`: the template renders them, the calls and the answers are
trained on and the tool outputs are not, malformed tool use is a bad record, and regenerating
keeps the calls and answers only the text turns."""

from __future__ import annotations

import json

from test_datasets import CHATML_TEMPLATE, TURN_END, make_tokenizer, runs, write_jsonl
from test_regenerate import config_for, greedy_answer, read_lines, save_tiny_target

import specjax
from specjax.training import datasets
from specjax.training.datasets import DatasetConfig
from specjax.training.regenerate import regenerate

# A ChatML template with tool use in the style of Qwen2.5's: the tools listed in a system turn,
# each call rendered as <tool_call>name {arguments as JSON}</tool_call>.
TOOL_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\nTools: ' }}"
    "{% for tool in tools %}{{ tool['function']['name'] }}{% if not loop.last %}{{ ', ' }}{% endif %}{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message.get('tool_calls') %}{% for call in message['tool_calls'] %}"
    "{{ '<tool_call>' + call['function']['name'] + ' ' }}{{ call['function']['arguments'] | tojson }}"
    "{{ '</tool_call>' }}{% endfor %}"
    "{% else %}{{ message['content'] }}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOL_CHAT = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},  # OpenAI: content null beside calls
    {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "18 C and sunny"},
    {"role": "assistant", "content": "It is 18 C and sunny in Paris."},
]
RENDERED_CALL = '<tool_call>get_weather {"city": "Paris"}</tool_call>'  # arguments parsed, not a quoted string


def trained_text(tokenizer, record) -> list[str]:
    return [tokenizer.decode(record.ids[a:b], skip_special_tokens=False) for a, b in runs(record.mask)]


def test_calls_and_answers_are_trained_on_and_tool_outputs_are_not(tmp_path):
    tokenizer = make_tokenizer(TOOL_TEMPLATE)
    path = write_jsonl(tmp_path / "tools.jsonl", [{"messages": TOOL_CHAT, "tools": TOOLS}, {"messages": TOOL_CHAT}])
    loaded = datasets.load_dataset(DatasetConfig(path=path, seq_len=16), tokenizer)
    assert not loaded.report.bad and [r.line for r in loaded.records] == [1, 2]
    with_tools, without = loaded.records
    text = tokenizer.decode(with_tools.ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nTools: get_weather<|im_end|>\n")
    assert "<|im_start|>tool\n18 C and sunny<|im_end|>" in text
    assert "Tools:" not in tokenizer.decode(without.ids, skip_special_tokens=False)
    for record in (with_tools, without):
        assert trained_text(tokenizer, record) == [RENDERED_CALL + TURN_END, TOOL_CHAT[3]["content"] + TURN_END]
    # The prompt of the last answer holds the call and the tool's output.
    assert with_tools.prompt.endswith("<|im_start|>tool\n18 C and sunny<|im_end|>\n<|im_start|>assistant\n")


def test_sharegpt_observation_turns_are_tool_turns(tmp_path):
    tokenizer = make_tokenizer(TOOL_TEMPLATE)
    turns = [("human", "Weather?"), ("gpt", "Let me look."), ("observation", "18 C"), ("gpt", "It is 18 C.")]
    row = {"conversations": [{"from": f, "value": v} for f, v in turns]}
    (record,) = datasets.load_dataset(DatasetConfig(path=write_jsonl(tmp_path / "s.jsonl", [row])), tokenizer).records
    assert "<|im_start|>tool\n18 C<|im_end|>" in tokenizer.decode(record.ids, skip_special_tokens=False)
    assert trained_text(tokenizer, record) == ["Let me look." + TURN_END, "It is 18 C." + TURN_END]


def test_malformed_tool_use_is_a_bad_record(tmp_path):
    tokenizer = make_tokenizer(TOOL_TEMPLATE)
    user, answer = TOOL_CHAT[0], TOOL_CHAT[3]
    rows = [
        {"messages": TOOL_CHAT, "tools": TOOLS},  # 1: good
        {"messages": [{**user, "tool_calls": [CALL]}, answer]},  # 2: a user turn cannot call tools
        {"messages": [user, {"role": "assistant", "content": None, "tool_calls": "get_weather"}]},  # 3
        {"messages": [user, {"role": "assistant", "content": None, "tool_calls": []}]},  # 4
        {"messages": [user, {"role": "assistant", "content": None}]},  # 5: neither text nor a call
        {"messages": [user, {**TOOL_CHAT[2], "tool_call_id": 7}, answer]},  # 6
        {"messages": TOOL_CHAT, "tools": "get_weather"},  # 7
        {"messages": [user, {"role": "assistant", "content": " ", "tool_calls": [CALL]}]},  # 8: good, a call only
    ]
    report = datasets.dataset_report(DatasetConfig(path=write_jsonl(tmp_path / "bad.jsonl", rows)), tokenizer)
    assert report.bad_lines == {"invalid_message": (2, 3, 4, 5, 6), "missing_field": (7,)}
    assert "'tools' is not a list of objects" in report.bad_details["missing_field"]
    assert sum(report.used.values()) == 2


def test_a_template_without_tool_use_is_reported_not_trained_on_silently(tmp_path):
    """SmolLM2's ChatML template renders message['content'] only: a call would train as an empty
    answer and the tools would vanish."""
    tokenizer = make_tokenizer(CHATML_TEMPLATE)
    user, answer = TOOL_CHAT[0], TOOL_CHAT[3]
    rows = [{"messages": TOOL_CHAT}, {"messages": [user, answer], "tools": TOOLS}, {"messages": [user, answer]}]
    report = datasets.dataset_report(DatasetConfig(path=write_jsonl(tmp_path / "t.jsonl", rows)), tokenizer)
    assert report.bad_lines == {"template_drops_tools": (1, 2)}
    assert "message 1 calls 'get_weather'" in report.bad_details["template_drops_tools"]
    # regenerate would answer without seeing the call or the tools: the same records are bad there
    target_dir = save_tiny_target(tokenizer, tmp_path / "target")
    data = write_jsonl(tmp_path / "r.jsonl", [{"messages": TOOL_CHAT[:3]}, *rows[1:]])
    summary = regenerate(config_for(target_dir, data, tmp_path / "out.jsonl"), progress=False)
    assert summary["bad_lines"] == {"template_drops_tools": [1, 2]} and summary["answered"] == 1


def test_regenerate_keeps_the_calls_and_answers_the_text_turns(tmp_path):
    tokenizer = make_tokenizer(TOOL_TEMPLATE)
    # <|im_end|> never wins, so every answer is MAX_NEW tokens and tells its prompts apart.
    target_dir = save_tiny_target(tokenizer, tmp_path / "target", eos_boost=0.0)
    rows = [
        {"messages": TOOL_CHAT, "tools": TOOLS},  # 1: the call kept, the answer after the tool output replaced
        {"messages": TOOL_CHAT[:3], "tools": TOOLS},  # 2: ends with the tool's output: an answer is appended
        {"messages": TOOL_CHAT[:2], "tools": TOOLS},  # 3: ends waiting for the tool
    ]
    out = tmp_path / "out.jsonl"
    summary = regenerate(config_for(target_dir, write_jsonl(tmp_path / "in.jsonl", rows), out), progress=False)
    assert summary["bad_lines"] == {"ends_in_tool_call": [3]}
    lines = read_lines(out)
    assert [x["source_line"] for x in lines] == [1, 2] and all(x["tools"] == TOOLS for x in lines)
    target = specjax.load_model(target_dir)
    expected, _ = greedy_answer(target, lines[0]["messages"][:3], tools=TOOLS)
    without_tools, _ = greedy_answer(target, lines[0]["messages"][:3])
    assert expected.strip() and expected != without_tools  # the tools reached the template
    for line in lines:
        messages = line["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
        assert messages[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
        assert messages[2] == TOOL_CHAT[2]
        assert messages[3] == {"role": "assistant", "content": expected}
    assert expected != TOOL_CHAT[3]["content"]
    # The output is itself a dataset, with the tools and the kept call rendered as before.
    (record, _) = datasets.load_dataset(DatasetConfig(path=str(out)), tokenizer).records
    assert trained_text(tokenizer, record)[0] == RENDERED_CALL + TURN_END
    assert json.loads(out.read_text().splitlines()[0])["regenerated"]["finished"] is False  # cut at MAX_NEW
