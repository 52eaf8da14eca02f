"""llama.cpp as a peer: a Python handle on scripts/peers/llama_cpp.mjs run as a server.

One long-lived `node llama_cpp.mjs --serve` process holds every GGUF file loaded (so the
driver can time llama.cpp round-robin with specjax and transformers in one script) and
answers one JSON line per request. node-llama-cpp is installed outside the repo (see
results/peers/README.md); its node_modules folder comes from --llama-modules or
$SPECJAX_PEERS_NODE_MODULES, default /work/peers_node/node_modules.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).with_name("llama_cpp.mjs")
DEFAULT_MODULES = Path(os.environ.get("SPECJAX_PEERS_NODE_MODULES", "/work/peers_node/node_modules"))
INSTALL = (
    "mkdir -p /work/peers_node && cp scripts/peers/package.json /work/peers_node/ && cd /work/peers_node && "
    "NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --omit=optional --no-audit --no-fund"
)


class PeerError(RuntimeError):
    """A peer that could not be installed, started or run: the message is the exact error."""


class LlamaCppServer:
    def __init__(self, modules: Path = DEFAULT_MODULES, threads: int = 2):
        node = shutil.which("node")
        if node is None:
            raise PeerError("node is not on PATH (node 20 runs node-llama-cpp 3.21.1)")
        if not (Path(modules) / "node-llama-cpp" / "package.json").is_file():
            raise PeerError(f"node-llama-cpp is not installed under {modules}; install it with: {INSTALL}")
        self.threads = threads
        self.process = subprocess.Popen(
            [node, str(SCRIPT), "--modules", str(modules), "--serve", "--threads", str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.info = self.request({"cmd": "info"})

    def request(self, message: dict) -> dict:
        """Send one request; its result, or PeerError with node's own error text."""
        if self.process.poll() is not None:
            raise PeerError(f"the llama.cpp server exited ({self.process.returncode}): {self.process.stderr.read()}")
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=10)
            raise PeerError(f"the llama.cpp server exited ({self.process.returncode}): {self.process.stderr.read()}")
        reply = json.loads(line)
        if not reply["ok"]:
            raise PeerError(reply["error"])
        return reply["result"]

    def load(self, name: str, model: Path, draft: Path | None, k: int, kv: str = "F32") -> dict:
        """Load `model` (and `draft`) under `name` with a context per method: plain, lookup, draft."""
        spec = {"cmd": "load", "id": name, "model": str(model), "draft": None if draft is None else str(draft)}
        return self.request(spec | {"threads": self.threads, "k": k, "kv": kv})

    def generate(self, name: str, method: str, tokens: list[int], n: int) -> dict:
        """{tokens, seconds (timed inside node: the prefill and n tokens), tokens_per_second, predictions}."""
        return self.request({"cmd": "generate", "id": name, "method": method, "tokens": list(tokens), "n": n})

    def tokenize(self, name: str, text: str) -> list[int]:
        return self.request({"cmd": "tokenize", "id": name, "text": text})["tokens"]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def methods(server: LlamaCppServer, formats: list[str], k: int, kinds: list[str], on_error) -> list:
    """llama.cpp's methods on the target GGUF in each of `formats` (Q4_1: the packaged file;
    F32 / BF16 / Q8_0: derived from it, scripts/peers/weights.py), each with its draft GGUF."""
    import weights
    from method import Call, Method

    names = {"plain": "plain", "lookup n=1-3": "lookup", "distilled draft": "draft"}
    out = []
    for fmt in formats:
        try:
            model = weights.target_file(fmt)
            draft = weights.draft_gguf(fmt) if "distilled draft" in kinds else None
            info = server.load(fmt, model, draft, k)
        except Exception as error:  # reported with its message, never dropped
            on_error(f"llama.cpp {fmt}", error)
            continue
        per_step = weights.weight_bytes_per_token(model)["per_step"]
        for kind in kinds:
            if names[kind] not in info["methods"]:
                continue

            def run(ids: list[int], n: int, fmt=fmt, method=names[kind]) -> Call:
                result = server.generate(fmt, method, ids, n)
                return Call(result["tokens"], result["seconds"], extra={"predictions": result["predictions"]})

            computes = {
                "F32": "float32",
                "BF16": "bfloat16 weights, float32 activations",
                "Q8_0": "Q8_0 weights x Q8_0 activations",
                "Q4_1": "Q4_1 weights x Q8_1 activations",
            }
            draft_note = f"draft GGUF {'Q8_0' if fmt == 'Q4_1' else fmt}" if kind == "distilled draft" else ""
            notes = [f"K = {k}" if kind != "plain" else "", draft_note, "KV cache F32"]
            out.append(
                Method(
                    peer="llama.cpp",
                    name=f"llama.cpp {fmt} {kind}",
                    kind=kind,
                    weights=f"GGUF {fmt}" + ("" if fmt == "Q4_1" else " (from the Q4_1 file's float32)"),
                    computes_in=computes[fmt],
                    twin=weights.SPECJAX_TWIN[fmt],
                    run=run,
                    bytes_per_step=per_step,
                    notes=", ".join(x for x in notes if x),
                )
            )
    return out
