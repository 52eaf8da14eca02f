// llama.cpp (through node-llama-cpp 3.21.1) as a peer of specjax: greedy generation of
// exactly N tokens from given prompt token ids, plain and with llama.cpp's own speculation
// (node-llama-cpp's token predictors: a draft model, DraftSequenceTokenPredictor; prompt
// lookup, InputLookupTokenPredictor). Prompts come as token ids, not text, so every peer
// decodes from the same ids and outputs compare token for token.
//
// Two modes:
//   node llama_cpp.mjs --modules DIR --model F.gguf [--draft D.gguf] --prompts P.json --n 64
//       one shot: P.json is [[ids...], ...]; prints one JSON object (tokens, seconds, tokens/s per prompt)
//   node llama_cpp.mjs --modules DIR --serve
//       JSON lines on stdin, one JSON line answered per request (scripts/peers/llama_cpp.py drives it):
//       {"cmd": "load", "id": "q4_1", "model": F, "draft": D|null, "threads": 2, "kv": "F32", "k": 4}
//       {"cmd": "generate", "id": "q4_1", "method": "plain"|"lookup"|"draft", "tokens": [...], "n": 64}
//       {"cmd": "tokenize", "id": "q4_1", "text": "..."}
// DIR is the node_modules folder node-llama-cpp was installed into (outside the repo).
import { createInterface } from "node:readline";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { performance } from "node:perf_hooks";

function parseArgs(argv) {
  const args = { threads: 2, n: 64, k: 4, kv: "F32", context: 4096, serve: false };
  for (let i = 0; i < argv.length; i++) {
    const key = argv[i].replace(/^--/, "");
    if (key === "serve") args.serve = true;
    else args[key] = argv[++i];
  }
  for (const key of ["threads", "n", "k", "context"]) args[key] = Number(args[key]);
  if (!args.modules) throw new Error("--modules DIR (the node_modules folder holding node-llama-cpp) is required");
  return args;
}

const args = parseArgs(process.argv.slice(2));
const lib = await import(pathToFileURL(join(args.modules, "node-llama-cpp", "dist", "index.js")).href);
const { getLlama, LlamaLogLevel, DraftSequenceTokenPredictor, InputLookupTokenPredictor } = lib;
// build: "never" and skipDownload: the prebuilt @node-llama-cpp/linux-x64 binary or an error,
// never a download or a compile at run time. gpu: false: the CPU, as every other peer here.
const llama = await getLlama({
  gpu: false, build: "never", skipDownload: true, maxThreads: args.threads, logLevel: LlamaLogLevel.error,
});
const loaded = new Map(); // id -> {model, draft, contexts: {method: {context, sequence}}, spec}

async function load(spec) {
  const threads = Number(spec.threads ?? args.threads);
  const k = Number(spec.k ?? args.k);
  const kv = spec.kv ?? args.kv;
  const contextSize = Number(spec.context ?? args.context);
  // llama.cpp's default KV cache is F16; F32 here, as specjax and transformers keep theirs.
  const contextOptions = {
    contextSize, threads, sequences: 1, flashAttention: false,
    experimentalKvCacheKeyType: kv, experimentalKvCacheValueType: kv,
  };
  const model = await llama.loadModel({ modelPath: spec.model, gpuLayers: 0 });
  const entry = { model, spec: { ...spec, threads, k, kv, contextSize }, contexts: {} };
  const plainContext = await model.createContext(contextOptions);
  entry.contexts.plain = { context: plainContext, sequence: plainContext.getSequence() };
  const lookupContext = await model.createContext(contextOptions);
  // n = 1..3 as specjax's lookup; at most K tokens a round. It searches only the tokens given
  // to updateInputTokens (the prompt, set per call below), not the tokens generated so far.
  const lookup = new InputLookupTokenPredictor({ patternLength: { min: 1, max: 3 }, predictionLength: { min: 1, max: k } });
  entry.contexts.lookup = { context: lookupContext, predictor: lookup, sequence: lookupContext.getSequence({ tokenPredictor: lookup }) };
  if (spec.draft) {
    entry.draft = await llama.loadModel({ modelPath: spec.draft, gpuLayers: 0 });
    const draftContext = await entry.draft.createContext(contextOptions);
    const targetContext = await model.createContext(contextOptions);
    entry.contexts.draft = {
      context: targetContext,
      draftContext,
      // A constant K with no confidence stop: the like-for-like setting (specjax drafts K every round).
      sequence: targetContext.getSequence({
        tokenPredictor: new DraftSequenceTokenPredictor(draftContext.getSequence(), { minTokens: k, maxTokens: k, minConfidence: 0 }),
      }),
    };
  }
  loaded.set(spec.id, entry);
  return {
    id: spec.id, threads, k, kv, context: contextSize, methods: Object.keys(entry.contexts),
    model_bytes: entry.model.size, draft_bytes: entry.draft ? entry.draft.size : null,
    train_context: model.trainContextSize, vocab_size: model.tokens.vocabSize ?? null,
  };
}

async function generate(request) {
  const entry = loaded.get(request.id);
  if (!entry) throw new Error(`no model loaded under id ${JSON.stringify(request.id)}`);
  const slot = entry.contexts[request.method];
  if (!slot) throw new Error(`method ${JSON.stringify(request.method)} is not loaded for ${request.id} (have ${Object.keys(entry.contexts)})`);
  const n = Number(request.n ?? args.n);
  const sequence = slot.sequence;
  // A fresh prefill every call (as specjax and transformers do): no prefix reuse between calls.
  await sequence.clearHistory();
  if (slot.predictor) slot.predictor.updateInputTokens(request.tokens);
  const before = { ...sequence.tokenPredictions };
  const tokens = [];
  const start = performance.now();
  // temperature 0: llama.cpp's greedy sampler; yieldEogToken: EOS neither stops nor is
  // suppressed (specjax ignore_eos, transformers eos_token_id=None): exactly n tokens.
  for await (const token of sequence.evaluate(request.tokens, { temperature: 0, yieldEogToken: true })) {
    tokens.push(token);
    if (tokens.length >= n) break;
  }
  const seconds = (performance.now() - start) / 1000;
  const after = sequence.tokenPredictions;
  const predictions = Object.fromEntries(Object.keys(after).map((key) => [key, after[key] - before[key]]));
  return { tokens, seconds, tokens_per_second: tokens.length / seconds, predictions };
}

async function handle(request) {
  if (request.cmd === "load") return await load(request);
  if (request.cmd === "generate") return await generate(request);
  if (request.cmd === "tokenize") {
    const entry = loaded.get(request.id);
    return { tokens: entry.model.tokenize(request.text, true) };
  }
  if (request.cmd === "info") {
    const pkg = JSON.parse(readFileSync(join(args.modules, "node-llama-cpp", "package.json"), "utf8"));
    return {
      node: process.version, node_llama_cpp: pkg.version, llama_cpp_release: llama.llamaCppRelease,
      build_type: llama.buildType, gpu: llama.gpu, max_threads: llama.maxThreads,
      cpu_math_cores: llama.cpuMathCores, system_info: llama.systemInfo,
    };
  }
  throw new Error(`unknown cmd ${JSON.stringify(request.cmd)}`);
}

if (args.serve) {
  const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of lines) {
    if (!line.trim()) continue;
    let reply;
    try {
      reply = { ok: true, result: await handle(JSON.parse(line)) };
    } catch (error) {
      reply = { ok: false, error: `${error?.name ?? "Error"}: ${error?.message ?? error}` };
    }
    process.stdout.write(JSON.stringify(reply) + "\n");
  }
  await llama.dispose();
} else {
  if (!args.model || !args.prompts) throw new Error("one-shot mode needs --model F.gguf and --prompts P.json (or use --serve)");
  const prompts = JSON.parse(readFileSync(args.prompts, "utf8"));
  const info = await load({ id: "main", model: args.model, draft: args.draft ?? null });
  const results = {};
  for (const method of info.methods) {
    results[method] = [];
    for (const tokens of prompts) results[method].push(await generate({ id: "main", method, tokens, n: args.n }));
  }
  process.stdout.write(JSON.stringify({ info, results }, null, 1) + "\n");
  await llama.dispose();
}
