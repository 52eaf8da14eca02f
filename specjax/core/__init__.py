"""The core every layer above builds on, and which imports no drafter, tree or engine code.

sampling.py    logits -> processed distributions -> tokens (temperature, top-k/p, min-p)
acceptance.py  acceptance rules: how one round decides what to keep
loop.py        the shared loop pieces: CacheConfig, prefill, the token buffer, commit
state.py       LoopState (one state for every kind of generation), its static Plan, and
               finish_round, the epilogue every round kind ends with
"""
