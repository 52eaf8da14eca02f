"""Loop iterations timed in isolation: plain decode steps, speculative rounds, and a
drafter's `propose` alone (the draft time of any drafter, model or not).

Each is a jitted `fori_loop` of `inner` iterations on one state built like a generation's
(a prompt filling half the cache unless `fill` says otherwise), rewound after every
iteration so that any number of iterations fits the cache. Attention reads only the cache
blocks below the fill (models/attention.py), so fill and capacity both matter. Shapes are
static, so an iteration costs the same whatever it accepts. `TimedLoop.call` returns a callable
for timing.interleaved: the caller times rounds and proposals side by side, round-robin,
so that their ratio holds on a noisy machine. A loop's Plan is built as a generation's is,
by keyword, with the whole SamplingConfig (top-k and top-p cost time too) and the default
acceptance rule chosen where the generation's is (engine/plan.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from specjax.core.loop import DEFAULT_CACHE, CacheConfig, eos_ids
from specjax.core.sampling import SamplingConfig
from specjax.core.state import LoopState, Plan
from specjax.drafters import Drafter, DraftModel, as_drafter
from specjax.engine.generation import jit_init_state, loop_round
from specjax.engine.plan import default_rule_for
from specjax.engine.rounds import draft_context
from specjax.io.model import Model
from specjax.trees.tree import Tree

PARTS = ("step", "round", "propose")  # a plain decode step, a speculative round, a drafter's proposal


def draft_model_of(draft: Model | Drafter) -> Model | None:
    """The draft `Model` whose forwards make up the drafter's work, or None (any other drafter)."""
    drafter = as_drafter(draft)
    return drafter.model if isinstance(drafter, DraftModel) else None


@functools.partial(jax.jit, static_argnames=("inner",), donate_argnums=2)
def _rounds(target_params, draft_weights, state: LoopState, inner: int):
    """`inner` loop iterations (plain steps when the plan has no drafter, else rounds)."""

    def body_fn(_, s):
        # Rewind after each round: the same slots are rewritten, so any number of rounds fits the cache.
        return loop_round(target_params, draft_weights, s).replace(lengths=state.lengths, done=state.done)

    return jax.lax.fori_loop(0, inner, body_fn, state)


@functools.partial(jax.jit, static_argnames=("inner",), donate_argnums=2)
def _proposals(target_params, draft_weights, state: LoopState, inner: int):
    """`inner` proposals from one committed state: what a round spends before its verify.

    The drafter's state carries from one proposal to the next as it does across rounds
    (there is no update in between: `update` is bookkeeping the round's commit pays for).
    Returns (state, checksum [B]).
    """
    plan = state.plan

    def body_fn(i, carry):
        draft_state, checksum = carry
        # The committed sequence is the same every iteration, so XLA would hoist whatever
        # reads only it (all of a prompt lookup) out of the loop; the barrier ties it to the
        # carried state, so each iteration does the work a round does.
        tokens, lengths, draft_state = jax.lax.optimization_barrier((state.tokens, state.lengths, draft_state))
        ctx = draft_context(state.replace(tokens=tokens, lengths=lengths), target_params)
        proposal, draft_state = plan.drafter.propose(draft_weights, draft_state, ctx, jax.random.fold_in(state.rng, i))
        # Consume every token and, as the acceptance rule does, q at every drafted token, so
        # that XLA drops none of the proposal as dead code.
        checksum = checksum + proposal.tokens.sum(axis=1).astype(jnp.float32)
        if proposal.q is not None:
            checksum = checksum + jnp.take_along_axis(proposal.q, proposal.tokens[..., None], axis=-1).sum(axis=(1, 2))
        return draft_state, checksum

    init = (state.draft_state, jnp.zeros(state.lengths.shape, jnp.float32))
    draft_state, checksum = jax.lax.fori_loop(0, inner, body_fn, init)
    return state.replace(draft_state=draft_state), checksum


@dataclasses.dataclass(frozen=True, eq=False)
class TimedLoop:
    """One loop to time: `part` ("step", "round" or "propose") of `target` (and `draft`) at
    batch `batch`, K = `k` (a tree's node count with `tree`), on a cache of `context` slots
    holding `fill` committed tokens (default: half of them), sampling as `sampling` says (a
    SamplingConfig, or a bare temperature: no top-k, top-p or min-p)."""

    part: str
    target: Model
    draft: Any
    batch: int
    k: int
    context: int
    sampling: SamplingConfig | float
    fill: int | None = None
    cache: CacheConfig = DEFAULT_CACHE
    tree: Tree | None = None

    def __post_init__(self):
        if not isinstance(self.sampling, SamplingConfig):
            object.__setattr__(self, "sampling", SamplingConfig(temperature=float(self.sampling)))

    @property
    def key(self) -> tuple:
        """What identifies it: its part, the arrays it reads (by identity) and its shapes."""
        shape = (self.batch, self.context, self.sampling, self.fill, self.cache, self.tree)
        if self.part == "step":
            return (self.part, id(self.target.params), *shape)
        drafter = as_drafter(self.draft)
        weights = jax.tree.leaves(drafter.weights())
        return (self.part, id(self.target.params), drafter.without_weights(), *map(id, weights), self.k, *shape)

    def call(self, inner: int):
        """A callable running `inner` iterations; returns arrays to block on."""
        return _loop_call(self, inner)


def filled_state(target: Model, weights, plan: Plan, fill: int, batch: int, context: int):
    """The loop state after prefilling `batch` rows of `fill` tokens into `context` slots:
    where every timed loop starts."""
    prompt = jnp.ones((batch, fill), jnp.int32)
    lengths = jnp.full((batch,), fill, jnp.int32)
    return jit_init_state(
        target.params, weights, prompt, lengths, jnp.int32(context), jax.device_put(eos_ids(None)),
        jax.random.key(0), plan=plan, cache_length=context,
    )  # fmt: skip


def _loop_call(loop: TimedLoop, inner: int):
    part, target, draft, batch, k, context = loop.part, loop.target, loop.draft, loop.batch, loop.k, loop.context
    sampling, fill, cache, tree = loop.sampling, loop.fill, loop.cache, loop.tree
    if part not in PARTS:
        raise ValueError(f"part must be one of {PARTS}, got {part!r}")
    prompt_length = context // 2 if fill is None else fill
    if not 1 <= prompt_length <= context - k - 2:
        raise ValueError(f"a fill of {prompt_length} leaves no room for a round of K={k} in {context} slots")
    drafter = weights = None
    if part == "step":
        plan = Plan(target=target.config, drafter=None, num_speculative_tokens=0, sampling=sampling, rule=None,
                    cache=cache)  # fmt: skip
    else:
        drafter = as_drafter(draft)
        weights = drafter.weights()
        plan = Plan(
            target=target.config,
            drafter=drafter.without_weights(),
            num_speculative_tokens=k,
            sampling=sampling,
            rule=default_rule_for(sampling, tree_rounds=tree is not None),
            cache=cache,
            tree=tree,
        )
    state = filled_state(target, weights, plan, prompt_length, batch, context)

    def call():
        nonlocal state
        if part in ("step", "round"):
            state = _rounds(target.params, weights, state, inner)
            return state.tokens
        state, checksum = _proposals(target.params, weights, state, inner)
        return checksum

    return call
