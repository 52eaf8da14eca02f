"""What running the rounds in interruptible chunks costs against one compiled loop.

`PreparedGeneration.run()` (what `specjax.generate` and `specjax generate` use) prefills,
then runs the rounds in chunks of about CHUNK_SECONDS with the host in between, so Ctrl-C
stops it; `launch()` is prefill and every round in one program. Both give the same tokens.
This times them round-robin (medians) for plain and speculative decoding of the same
prompts, after a warm-up call each (compilation excluded), and checks the tokens agree.
A ratio near 1 within the spread of the repeats means chunking costs nothing measurable.

    python scripts/chunking_cost.py                        # the embedded pair
    python scripts/chunking_cost.py --target smollm2-135m-instruct --draft layer-skip:15 --new 128
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import specjax
from specjax.bench.timing import environment, interleaved, median

PROMPT = "def merge_sorted(a, b):\n    result = []\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="stdlib-target")
    parser.add_argument("--draft", default="stdlib-draft", help="a drafter spec, as `specjax generate --drafter`")
    parser.add_argument("--new", type=int, default=200, help="tokens per row")
    parser.add_argument("--batch", type=int, default=1, help="rows (copies of the prompt)")
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=None, help="write the results as JSON here too")
    args = parser.parse_args()

    target = specjax.load_model(args.target)
    config = specjax.GenerationConfig(max_new_tokens=args.new, ignore_eos=True)
    speculative = specjax.SpeculativeConfig.parse(args.draft, "--draft").replace(num_speculative_tokens=args.k)
    prompts = [PROMPT] * args.batch
    calls = {
        "plain": specjax.prepare(target, prompts, config),
        f"speculative K={args.k}": specjax.prepare(target, prompts, config, speculative=speculative),
    }
    fns = {}
    for name, call in calls.items():
        call.compile()
        assert call.run().tokens == call.collect(call.launch()).tokens, f"{name}: chunked != one program"
        fns[(name, "one program")] = call.launch
        fns[(name, "chunked")] = call.decode
    times = interleaved(fns, args.repeats, warmup=1)
    rows = []
    for name in calls:
        one, chunked = times[(name, "one program")], times[(name, "chunked")]
        rows.append(
            {
                "decoding": name,
                "one_program_median_s": median(one),
                "chunked_median_s": median(chunked),
                "ratio": median(chunked) / median(one),
                "one_program_s": one,
                "chunked_s": chunked,
            }
        )
        print(
            f"{name:>16}: one program {median(one):.4f} s [{min(one):.4f}, {max(one):.4f}], "
            f"chunked {median(chunked):.4f} s [{min(chunked):.4f}, {max(chunked):.4f}], "
            f"ratio {median(chunked) / median(one):.3f}"
        )
    env = environment()
    shape = f"{args.batch} row(s) x {args.new} tokens, median of {args.repeats}"
    print(f"on {env['cpu']} ({env['backend']}, {env['device']}): {shape}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows, "environment": env}, indent=1))


if __name__ == "__main__":
    main()
