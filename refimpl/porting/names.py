"""The official module names that a trace needs and the stage code does not record.

Stage code records each tensor it computes once, under the name of the unit that computes it
(``refimpl.recorder``).  The official model has more names than that: wrapper modules whose output is
the very tensor of the module inside them, Identity modules, a rotary module in every attention layer
that hands out the stack's one table, the untrimmed output of a transposed conv (which our code computes
once and records as the extra ``untrimmed`` before it takes the trimmed view).  The table below gives
those names; ``official_calls`` applies it to the calls a run recorded, before the calls are named by
the ``:N`` rule and written (``refimpl.porting.trace_files``), so that a trace's keys are the official
hook dump's, in its order (tests/porting/test_trace.py).

    official name (hook dump)                        the tensor, as our stage code records it
    X.conv, before X: the codec's conv wrappers       X (a ``CausalConvNet`` / ``MimiConv1d`` X, found
      X around their Conv1d                            by its weights ``X.conv.*``)
    X.conv: a transposed conv's ConvTranspose1d       refimpl.X.untrimmed (renamed where it stands)
    decoder.pre_transformer.layers.{i}.self_attn      ...self_attn.q_proj / k_proj [B, T, H*D] in heads,
      .q_norm / .k_norm (Identity: no q/k norm)          [B, T, H, D]; D from the stack's rotary table
    encoder.encoder_transformer.layers.{i}.self_attn  refimpl.encoder.encoder_transformer.rope.cos, the
      .rotary_emb, after v_proj (Mimi: per layer)       stack's table, computed once
    encoder.encoder.layers.{i}.shortcut, after        the residual block's input, encoder.encoder.layers.{i-1}
      ...block.3 (Identity, without a shortcut conv)
    speaker_encoder.{TDNN block}.activation,          the TDNN block X (conv -> ReLU: the block's output
      before X                                         is its activation's)

A dict or ``CallLog`` given as ``trace=`` to a stage holds what the stage code records, without these
names; ``refimpl.porting.trace_files`` builds the whole traces.  (The Talker's and the code predictor's
wrappers, ``talker.model``, ``talker``, ``talker.code_predictor``..., are still recorded by the generation
code: a streamed generation's raw ``CallLog`` is compared key for key with a whole trace.)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ..recorder import EXTRA_PREFIX

__all__ = ["Alias", "ALIASES", "official_calls", "conv_wrappers"]


@dataclass
class Run:
    """What an alias may look at: the calls named so far (name -> tensor, the last call of each) and the
    run's conv units (``conv_wrappers``)."""

    recorded: dict
    wrappers: frozenset


def same(value, match, run: Run):
    """The tensor itself."""
    return value


def as_heads(value_btc, match, run: Run):
    """An Identity q_norm / k_norm of a stack without q/k norm: the projection split into heads,
    [B, T, H*D] -> [B, T, H, D], D being the width of the stack's rotary table (recorded before its layers)."""
    table = run.recorded.get(f"{match['stack']}.rotary_emb")
    if table is None:
        raise ValueError(f"cannot name {match[0]}'s Identity q/k norm: no {match['stack']}.rotary_emb recorded")
    B, T, _ = value_btc.shape
    return value_btc.reshape(B, T, -1, table.shape[-1])


def stack_rotary_cos(value, match, run: Run):
    """The cos table the stack computed once (the extra ``{stack}.rope.cos``), which every layer's own
    rotary module returns."""
    key = f"{EXTRA_PREFIX}{match['stack']}.rope.cos"
    if key not in run.recorded:
        raise ValueError(f"cannot name {match[0]}'s rotary module: no {key} recorded")
    return run.recorded[key]


def identity_shortcut(value, match, run: Run):
    """A SEANet residual block's Identity shortcut: the block's input, the output of the layer before it
    (None, no alias, where the shortcut is a conv: the stage code records that one)."""
    block, index = match["block"], int(match["index"])
    if f"{block}.shortcut" in run.wrappers:
        return None
    key = f"{match['layers']}.{index - 1}"
    if key not in run.recorded:
        raise ValueError(f"cannot name {block}.shortcut: no {key} recorded")
    return run.recorded[key]


@dataclass(frozen=True)
class Alias:
    """After (or before) each recorded name matching ``pattern`` in full, the official model also has the
    name ``name`` (a ``re`` template over the pattern's groups) for ``value(tensor, match, run)`` (None:
    not here)."""

    pattern: str
    name: str
    where: str  # "before" or "after" the matched name, in call order
    value: Callable = same


TDNN_BLOCKS = r"blocks\.0|blocks\.\d+\.tdnn[12]|blocks\.\d+\.res2net_block\.blocks\.\d+|mfa|asp\.tdnn"

ALIASES = (
    # the codec decoder's layers have q_norm / k_norm modules, Identity (its attention has no q/k norm)
    Alias(
        r"(?P<stack>decoder\.pre_transformer)(?P<attn>\.layers\.\d+\.self_attn)\.q_proj",
        r"\g<stack>\g<attn>.q_norm",
        "after",
        as_heads,
    ),
    Alias(
        r"(?P<stack>decoder\.pre_transformer)(?P<attn>\.layers\.\d+\.self_attn)\.k_proj",
        r"\g<stack>\g<attn>.k_norm",
        "after",
        as_heads,
    ),
    # Mimi's attention calls its own rotary module (after v_proj); it returns the stack's cos table
    Alias(
        r"(?P<stack>encoder\.encoder_transformer)(?P<attn>\.layers\.\d+\.self_attn)\.v_proj",
        r"\g<stack>\g<attn>.rotary_emb",
        "after",
        stack_rotary_cos,
    ),
    # a SEANet residual block without a shortcut conv has an Identity shortcut, called after its block
    Alias(
        r"(?P<block>(?P<layers>encoder\.encoder\.layers)\.(?P<index>\d+))\.block\.3",
        r"\g<block>.shortcut",
        "after",
        identity_shortcut,
    ),
    # a TDNN block is conv -> ReLU: its output is its activation module's
    Alias(rf"speaker_encoder\.(?:{TDNN_BLOCKS})", r"\g<0>.activation", "before"),
)

UNTRIMMED = re.compile(re.escape(EXTRA_PREFIX) + r"(.+)\.untrimmed")


def conv_wrappers(prefix: str, weight_spec) -> frozenset:
    """The official names (``prefix`` + the checkpoint name X) of the codec's conv units: the modules X
    with weights ``X.conv.weight`` (a wrapper around the Conv1d or ConvTranspose1d ``X.conv``)."""
    tail = ".conv.weight"
    return frozenset(prefix + s.name[: -len(tail)] for s in weight_spec if s.name.endswith(tail))


def official_calls(calls, wrappers: frozenset = frozenset()) -> list:
    """[(name, tensor)] in the order recorded -> the same calls with the table's names added, in the
    official call order.  ``wrappers`` are the conv units of the run (``conv_wrappers``): each is preceded
    by its inner conv ``X.conv``, the same tensor, or for a transposed conv the untrimmed output that
    came just before it."""
    out, run = [], Run({}, wrappers)

    def emit(name, value):
        out.append((name, value))
        run.recorded[name] = value

    def emit_aliases(matches, where, value):
        for a, m in matches:
            if a.where == where and (aliased := a.value(value, m, run)) is not None:
                emit(m.expand(a.name), aliased)

    compiled = [(a, re.compile(a.pattern)) for a in ALIASES]
    for name, value in calls:
        untrimmed = UNTRIMMED.fullmatch(name)
        if untrimmed:
            emit(untrimmed[1] + ".conv", value)
            continue
        if name in wrappers and (not out or out[-1][0] != name + ".conv"):
            emit(name + ".conv", value)
        matches = [(a, m) for a, p in compiled if (m := p.fullmatch(name))]
        emit_aliases(matches, "before", value)
        emit(name, value)
        emit_aliases(matches, "after", value)
    return out
