"""Drafters: one file per way of proposing tokens (see base.py for the interface).

draft_model.py    a separate draft Model
parallel_draft.py a draft Model proposing K tokens from one forward over mask tokens (PARD)
layer_skip.py     the target's first N layers (self-speculation)
prompt_lookup.py  n-gram matching in the row's own prompt + output
suffix.py         suffix decoding: the longest match's most frequent continuation, own text and a pool
fallback.py       one drafter where it found something, another elsewhere
medusa.py         Medusa heads on the target's own hidden states
eagle.py          an EAGLE-style head: one layer extrapolating the target's features
block_head.py     a DFlash-style block head: K proposals from one non-causal pass over target states
dspark.py         DSpark: a block head plus a low-rank Markov head (each draft reads the one before) and a
                  confidence head (Proposal.confidence)
dflash2.py        DFlash 2: a block head plus a two-tap dynamic convolution across the block and a selector
                  choosing the proposal among the block's top paths
cross_vocab.py    a draft with another tokenizer, proposing only tokens both vocabularies share (TLI)
universal.py      a draft with another tokenizer, proposing through text re-encoded by the target's (UAG)
foreign_draft.py  what those two share: the draft's own cache in its own token positions, caught up
                  by the pieces of the committed target tokens (vocab_tables.py)
formats/          head files: specjax's own (`save_drafter`, `load_head`, checked against their target)
                  and the layouts others publish (EAGLE, EAGLE-3, Medusa, speculators), read and written
proposing.py      from distributions to proposals: draw, chains, one-pass blocks, tree expansion
common.py         protocol pieces several drafters share (weights, catch-up, block proposals, checks)
convert.py        `as_drafter`: a Model wherever a drafter is taken
registry.py       every kind by name: `make_drafter` builds the one a SpeculativeConfig names
                  (the API, the CLI's --drafter and bench configs all give one)
"""

from __future__ import annotations

from specjax.drafters.base import DraftContext, Drafter, Proposal, TreeProposal
from specjax.drafters.block_head import BlockHead
from specjax.drafters.convert import as_drafter
from specjax.drafters.cross_vocab import CrossVocab
from specjax.drafters.dflash2 import DFlash2
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.dspark import DSpark
from specjax.drafters.eagle import Eagle
from specjax.drafters.fallback import Fallback
from specjax.drafters.formats.native import load_head, save_drafter, target_fingerprint
from specjax.drafters.layer_skip import LayerSkip
from specjax.drafters.medusa import Medusa
from specjax.drafters.parallel_draft import ParallelDraft
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.drafters.registry import REGISTRY, make_drafter, register
from specjax.drafters.suffix import SuffixDecoding
from specjax.drafters.universal import Universal

__all__ = [
    "REGISTRY",
    "BlockHead",
    "CrossVocab",
    "DFlash2",
    "DSpark",
    "DraftContext",
    "DraftModel",
    "Drafter",
    "Eagle",
    "Fallback",
    "LayerSkip",
    "Medusa",
    "ParallelDraft",
    "PromptLookup",
    "Proposal",
    "SuffixDecoding",
    "TreeProposal",
    "Universal",
    "as_drafter",
    "load_head",
    "make_drafter",
    "register",
    "save_drafter",
    "target_fingerprint",
]
