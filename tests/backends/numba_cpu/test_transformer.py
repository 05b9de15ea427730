"""The fused stack (numba's ``transformer_stack``: a generation step's Qwen3 layers in a few calls) against the
layers it replaces, and which stacks it takes."""

from __future__ import annotations

import numpy as np
import pytest

from refimpl import backends as kernels
from refimpl import nn, transformer
from refimpl.backends import bf16, numba_cpu
from refimpl.backends.bf16 import BF16Matrix, float32_to_bf16_bits

from .cases import layer_step, needs_tiles, random_qwen3_layer


@needs_tiles
@pytest.mark.parametrize("T", [17, 30])
def test_fused_layer_on_tiles_equals_the_layer(T, monkeypatch):
    """A prompt's fused layer whose matrices fit the tiles (C = 64, F = 128: every O and I a multiple of 32)
    against the composition transformer_layer in float64 (the exact values of the same bf16 weights): on
    the tiles and on the block kernel (``USE_TILES`` off) within twice the float32 composition's distance
    plus the rounding floor of the longest reduction, and the two paths not the same bits (the tiles ran)."""
    C, H, G, D, F = 64, 4, 2, 16, 128
    out = {}
    for dtype in (np.float32, np.float64):
        lw, cfg = random_qwen3_layer(np.random.default_rng(T), C, H, G, D, F, dtype)
        x = np.random.default_rng(T + 1).standard_normal((1, T, C)).astype(dtype)
        cos, sin = nn.rope_cos_sin(np.arange(3, 3 + T), D, 10000.0, dtype)
        past = np.random.default_rng(T + 2).standard_normal((2, 1, G, 3, D)).astype(dtype)
        kinds = (
            (("tiles", True), ("block", False), ("reference", None)) if dtype == np.float32 else (("reference", None),)
        )
        for kind, tiles in kinds:
            cache = transformer.KVCache(1, G, D, dtype, capacity=4)
            cache.append(past[0], past[1])
            cache.reserve(T)
            if tiles is not None:
                monkeypatch.setattr(numba_cpu.amx, "USE_TILES", tiles)
            with kernels.use_backend("numpy"):
                out[kind, np.dtype(dtype).name] = layer_step(
                    x, lw, cfg, cos[None], sin[None], cache, 1e-6, fused=tiles is not None
                )
    exact = out["reference", "float64"].astype(np.float64)
    composition = out["reference", "float32"].astype(np.float64)
    floor = 2 * F * np.finfo(np.float32).eps * np.max(np.abs(exact))
    for kind in ("tiles", "block"):
        got = out[kind, "float32"].astype(np.float64)
        assert np.max(np.abs(got - exact)) <= 2 * np.max(np.abs(composition - exact)) + floor, kind
    assert not np.array_equal(out["tiles", "float32"], out["block", "float32"])


@pytest.mark.parametrize("n_cached", [0, 1, 16, 40])
@pytest.mark.parametrize("T", [1, 2, 5, 17, 30])  # 17 and 30: a prompt's positions, by the block kernel
@pytest.mark.parametrize("seed", [0, 1])
def test_fused_layer_equals_the_layer(n_cached, T, seed):
    """The fused layer for T new positions (bf16 words) against the composition transformer_layer, both in float32,
    each measured against the same layer in float64 (the exact values of the same bf16 weights): the twin
    may be off by no more than twice the float32 composition, plus a floor of the float32 rounding of the
    longest reduction (the MLP's, F terms) at the output's scale.  The new keys and values land in the
    cache like cache.append's, and the length grows by T."""
    C, H, G, D, F = 48, 4, 2, 16, 96
    eps = 1e-6
    out = {}
    for dtype in (np.float32, np.float64):
        lw, cfg = random_qwen3_layer(np.random.default_rng(seed), C, H, G, D, F, dtype)
        x = np.random.default_rng(seed + 7).standard_normal((1, T, C)).astype(dtype)
        cos, sin = nn.rope_cos_sin(np.arange(n_cached, n_cached + T), D, 10000.0, dtype)
        past = np.random.default_rng(seed + 9).standard_normal((2, 1, G, n_cached, D)).astype(dtype)
        for kind in ("twin", "reference") if dtype == np.float32 else ("reference",):
            cache = transformer.KVCache(1, G, D, dtype, capacity=4)
            cache.append(past[0], past[1])
            cache.reserve(T)
            with kernels.use_backend("numpy"):
                y = layer_step(x, lw, cfg, cos[None], sin[None], cache, eps, fused=kind == "twin")
            assert y.shape == (1, T, C) and y.dtype == dtype and cache.length == n_cached + T
            out[kind, np.dtype(dtype).name] = (
                y,
                cache.k[:, :, : n_cached + T].copy(),
                cache.v[:, :, : n_cached + T].copy(),
            )
    exact = [a.astype(np.float64) for a in out["reference", "float64"]]
    for i, what in enumerate(("output", "keys", "values")):
        twin = out["twin", "float32"][i].astype(np.float64)
        composition = out["reference", "float32"][i].astype(np.float64)
        floor = 2 * F * np.finfo(np.float32).eps * np.max(np.abs(exact[i]))
        assert np.max(np.abs(twin - exact[i])) <= 2 * np.max(np.abs(composition - exact[i])) + floor, what


@pytest.mark.parametrize("n_cached", [0, 7])
@pytest.mark.parametrize("T", [1, 2, 5, 17, 30])
def test_fused_layer_for_the_last_position_alone_keeps_its_bits(n_cached, T):
    """``last_only``: the fused layer's output at the last position, computed for it alone past the keys
    and values, has the bits of the full layer's last row (the kernel is chosen by the layer's T), and the
    cache holds the same keys and values; the reference returns its full output's last row."""
    C, H, G, D, F = 48, 4, 2, 16, 96
    lw, cfg = random_qwen3_layer(np.random.default_rng(T), C, H, G, D, F, np.float32)
    x = np.random.default_rng(T + 1).standard_normal((1, T, C)).astype(np.float32)
    cos, sin = nn.rope_cos_sin(np.arange(n_cached, n_cached + T), D, 10000.0, np.float32)
    past = np.random.default_rng(T + 2).standard_normal((2, 1, G, n_cached, D)).astype(np.float32)
    out = {}
    for kind in ("twin", "reference"):
        for last_only in (False, True):
            cache = transformer.KVCache(1, G, D, np.float32, capacity=4)
            cache.append(past[0], past[1])
            cache.reserve(T)
            with kernels.use_backend("numpy"):
                y = layer_step(x, lw, cfg, cos[None], sin[None], cache, 1e-6, last_only, fused=kind == "twin")
            out[kind, last_only] = (y, cache.k[:, :, : n_cached + T].copy(), cache.v[:, :, : n_cached + T].copy())
    for kind in ("twin", "reference"):
        full, last = out[kind, False], out[kind, True]
        assert last[0].shape == (1, 1, C)
        np.testing.assert_array_equal(last[0], full[0][:, -1:])
        np.testing.assert_array_equal(last[1], full[1])
        np.testing.assert_array_equal(last[2], full[2])


def test_the_stack_returns_the_last_position_alone_with_the_same_bits():
    """transformer_stack(..., last_only=True): the full stack's last row, bit for bit, on the fused path (a
    28-position prompt of two layers) and on the layer by layer path (a recorder given), the caches alike."""
    from refimpl.recorder import Recorder

    C, H, G, D, F = 32, 4, 2, 8, 64
    lw, cfg = random_qwen3_layer(np.random.default_rng(5), C, H, G, D, F, np.float32)
    x = np.random.default_rng(6).standard_normal((1, 28, C)).astype(np.float32)
    cos, sin = nn.rope_cos_sin(nn.arange(0, 28), D, 10000.0, np.float32)
    mask = nn.AttentionMask(nn.arange(0, 28), nn.arange(28))
    for record in (Recorder(None), Recorder({})):
        outs = {}
        for last_only in (False, True):
            caches = [transformer.KVCache(1, G, D, np.float32, capacity=2) for _ in range(2)]
            with kernels.use_backend("numba"):
                y = transformer.transformer_stack(
                    [lw, lw], transformer.QWEN3, cfg, x, cos[None], sin[None], mask, caches, 1e-6, record, last_only
                )
            outs[last_only] = (y, [c.k[:, :, :28].copy() for c in caches])
        assert outs[True][0].shape == (1, 1, C)
        np.testing.assert_array_equal(outs[True][0], outs[False][0][:, -1:])
        for a, b in zip(outs[True][1], outs[False][1], strict=True):
            np.testing.assert_array_equal(a, b)


def test_the_stack_takes_the_fused_step_only_where_it_fits():
    """transformer_stack runs numba's twin (the layers fused, one call for the stack) for up to 64 new
    positions of one row with bf16 layers and plain caches, nothing recorded; a longer prompt (65 positions),
    a recorder or float32 matrices take the layer by layer path.  Over a prompt, a 30-position continuation,
    a 2-position step and two 1-position steps the two paths give the same values (float32 bound)."""
    from refimpl.recorder import Recorder

    rng = np.random.default_rng(3)
    C, H, G, D, F = 32, 4, 2, 8, 64
    lw, cfg = random_qwen3_layer(rng, C, H, G, D, F, np.float32)
    layers = [lw, lw]
    calls = []
    fused = numba_cpu.transformer.transformer_stack

    def counting(*args):
        result = fused(*args)
        calls.extend([1] if result is not NotImplemented else [])
        return result

    results = {}
    for path in ("fused", "layer by layer"):
        caches = [transformer.KVCache(1, G, D, np.float32, capacity=2) for _ in layers]
        many = numba_cpu.transformer.STEP_MAX_POSITIONS + 1
        xs = np.random.default_rng(4).standard_normal((1, many + 34, C)).astype(np.float32)
        outs = []
        for start, stop in (
            (0, many),
            (many, many + 30),
            (many + 30, many + 32),
            (many + 32, many + 33),
            (many + 33, many + 34),
        ):
            pos = nn.arange(start, stop)
            cos, sin = nn.rope_cos_sin(pos, D, 10000.0, np.float32)
            mask = nn.AttentionMask(pos, nn.arange(stop))
            record = Recorder({}) if path == "layer by layer" else Recorder(None)
            table = kernels.REGISTRY["numba"].twins  # the table the registry reads (numba_cpu.TWINS)
            table["transformer_stack"] = counting
            try:
                with kernels.use_backend("numba"):
                    outs.append(
                        transformer.transformer_stack(
                            layers,
                            transformer.QWEN3,
                            cfg,
                            xs[:, start:stop],
                            cos[None],
                            sin[None],
                            mask,
                            caches,
                            1e-6,
                            record,
                        )
                    )
            finally:
                table["transformer_stack"] = fused
        results[path] = np.concatenate(outs, axis=1)
        assert len(calls) == 4  # the four steps, not the 65-position prompt; unchanged with a recorder given
    np.testing.assert_allclose(results["fused"], results["layer by layer"], rtol=1e-4, atol=1e-5)


def test_several_new_positions_take_the_fused_step_only_in_the_cache_order():
    """Two new positions are fused where they are the cache's next two and see the keys causally; queries at
    other positions (a mask not the cache's order), caches of different lengths, two rows in caches of one
    row, or more than STEP_MAX_POSITIONS positions take the layer by layer path."""
    lw, _ = random_qwen3_layer(np.random.default_rng(0), 16, 2, 1, 8, 32, np.float32)
    caches = [transformer.KVCache(1, 1, 8, np.float32, capacity=8) for _ in range(2)]
    for c in caches:
        c.append(*np.zeros((2, 1, 1, 3, 8), np.float32))
    fits = lambda x, mask, cs=caches: (  # noqa: E731
        numba_cpu.transformer._fits([lw, lw], transformer.QWEN3, x, mask, cs) is not None
    )
    two = np.zeros((1, 2, 16), np.float32)
    assert fits(two, nn.AttentionMask(nn.arange(3, 5), nn.arange(5)))
    assert not fits(two, nn.AttentionMask(nn.arange(4, 6), nn.arange(6)))  # not the cache's next positions
    assert not fits(two, nn.AttentionMask(nn.arange(3, 5), nn.arange(1, 6)))  # keys not the cache's
    uneven = [caches[0], transformer.KVCache(1, 1, 8, np.float32, capacity=8)]
    assert not fits(two, nn.AttentionMask(nn.arange(3, 5), nn.arange(5)), uneven)
    assert not fits(np.zeros((2, 2, 16), np.float32), nn.AttentionMask(nn.arange(3, 5), nn.arange(5)))
    many = numba_cpu.transformer.STEP_MAX_POSITIONS + 1
    assert not fits(np.zeros((1, many, 16), np.float32), nn.AttentionMask(nn.arange(3, 3 + many), nn.arange(3 + many)))


def test_a_batch_takes_the_fused_step_where_its_keys_are_left_padded():
    """B rows in caches of B rows are fused, each row's first valid key found; key validity that is not a
    prefix of padding followed by valid keys (a hole, a key valid before a padded one) is not."""
    lw, _ = random_qwen3_layer(np.random.default_rng(0), 16, 2, 1, 8, 32, np.float32)
    caches = [transformer.KVCache(3, 1, 8, np.float32, capacity=8) for _ in range(2)]
    for c in caches:
        c.append(*np.zeros((2, 3, 1, 3, 8), np.float32))
    x = np.zeros((3, 1, 16), np.float32)

    def first_keys(valid):
        mask = nn.AttentionMask(nn.arange(3, 4), nn.arange(4), key_valid_bs=valid)
        return numba_cpu.transformer._fits([lw, lw], transformer.QWEN3, x, mask, caches)

    np.testing.assert_array_equal(first_keys(None), [0, 0, 0])
    padded = np.array([[1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1]], bool)
    np.testing.assert_array_equal(first_keys(padded), [0, 1, 3])
    assert first_keys(np.array([[1, 1, 1, 1], [0, 1, 0, 1], [1, 1, 1, 1]], bool)) is None
    assert first_keys(np.array([[1, 1, 1, 1], [1, 0, 1, 1], [1, 1, 1, 1]], bool)) is None
    assert (
        numba_cpu.transformer._fits(
            [lw, lw], transformer.QWEN3, x[:2], nn.AttentionMask(nn.arange(3, 4), nn.arange(4)), caches
        )
        is None
    )


def random_qwen3_stack(seed, L, C, H, G, D, F):
    """L different Qwen3 layers (``random_qwen3_layer``'s, float32 with bf16 matrices) in one weights dict
    under the checkpoints' names, as ``transformer.layer_views`` gives them, and their config."""
    weights = {}
    for i in range(L):
        lw, cfg = random_qwen3_layer(np.random.default_rng(seed + i), C, H, G, D, F, np.float32)
        weights.update({f"model.layers.{i}.{name}": tensor for name, tensor in lw.weights.items()})
    return weights, transformer.layer_views(weights, "model.layers.", L), cfg


@pytest.mark.parametrize("T", [1, 2, 17])  # a generation step, the code predictor's first pass, a prompt
@pytest.mark.parametrize("n_cached", [0, 3])
@pytest.mark.parametrize("last_only", [False, True])
@pytest.mark.parametrize("call_max_layers", [7, 2, 1])
def test_fused_stack_is_its_layers_fused_one_call_each(T, n_cached, last_only, call_max_layers, monkeypatch):
    """The stack in calls of at most ``CALL_MAX_LAYERS`` layers (numba's transformer_stack; three layers: one
    call, calls of 2 and 1, three calls) has the bits of its layers fused one call each: the output, every
    layer's new keys and values, and the caches' lengths, with caches that grow (capacity 2) and three
    layers of different weights."""
    C, H, G, D, F = 32, 4, 2, 8, 64
    weights, layers, cfg = random_qwen3_stack(11, 3, C, H, G, D, F)
    monkeypatch.setattr(numba_cpu.transformer, "CALL_MAX_LAYERS", call_max_layers)
    steps, layers_a_call = numba_cpu.transformer._decoder_steps_bf16, []

    def counted(x_btc, ln1_l, *args):
        layers_a_call.append(len(ln1_l))
        return steps(x_btc, ln1_l, *args)

    monkeypatch.setattr(numba_cpu.transformer, "_decoder_steps_bf16", counted)
    x = np.random.default_rng(T).standard_normal((1, T, C)).astype(np.float32)
    cos, sin = nn.rope_cos_sin(np.arange(n_cached, n_cached + T), D, 10000.0, np.float32)
    past = np.random.default_rng(T + 1).standard_normal((len(layers), 2, 1, G, n_cached, D)).astype(np.float32)
    out = {}
    for kind in ("twin", "layers"):
        caches = [transformer.KVCache(1, G, D, np.float32, capacity=2) for _ in layers]
        for cache, (k, v) in zip(caches, past, strict=True):
            cache.append(k, v)
        with kernels.use_backend("numba"):
            if kind == "twin":
                mask = nn.AttentionMask(nn.arange(n_cached, n_cached + T), nn.arange(n_cached + T))
                y = numba_cpu.transformer.transformer_stack(
                    *(layers, transformer.QWEN3, cfg, x, cos[None], sin[None], mask, caches, 1e-6, None, last_only)
                )
                assert layers_a_call == {7: [3], 2: [2, 1], 1: [1, 1, 1]}[call_max_layers]
            else:
                y = x
                for i, (lw, cache) in enumerate(zip(layers, caches, strict=True)):
                    cache.reserve(T)
                    y = layer_step(y, lw, cfg, cos[None], sin[None], cache, 1e-6, last_only and i == len(layers) - 1)
        assert y is not NotImplemented and all(c.length == n_cached + T for c in caches)
        out[kind] = (y, [(c.k[:, :, : n_cached + T].copy(), c.v[:, :, : n_cached + T].copy()) for c in caches])
    assert out["twin"][0].shape == (1, 1 if last_only else T, C)
    np.testing.assert_array_equal(out["twin"][0], out["layers"][0])
    for (k1, v1), (k2, v2) in zip(out["twin"][1], out["layers"][1], strict=True):
        np.testing.assert_array_equal(k1, k2)
        np.testing.assert_array_equal(v1, v2)


def test_fused_stack_runs_layers_it_cannot_pass_as_one_tuple_one_call_each():
    """Layers of two weights dicts, caches of different lengths, or a tensor whose type differs from the
    other layers' (a read-only norm among writable ones: no tuple Numba could index at run time) are no one
    stack's arguments (``_stack_arguments``): the twin runs them one call each, with the same bits."""
    C, H, G, D, F = 32, 4, 2, 8, 64
    weights, layers, cfg = random_qwen3_stack(21, 2, C, H, G, D, F)
    x = np.random.default_rng(1).standard_normal((1, 1, C)).astype(np.float32)
    cos, sin = nn.rope_cos_sin(np.arange(0, 1), D, 10000.0, np.float32)
    mask = nn.AttentionMask(nn.arange(0, 1), nn.arange(1))

    def caches(lengths=(0, 0)):
        made = [transformer.KVCache(1, G, D, np.float32, capacity=2) for _ in layers]
        for c, n in zip(made, lengths, strict=True):
            c.append(*np.zeros((2, 1, G, n, D), np.float32))
        return made

    def twin(layers, cs):
        assert numba_cpu.transformer._stack_arguments(layers, cs, 1) is None
        return numba_cpu.transformer.transformer_stack(
            layers, transformer.QWEN3, cfg, x, cos[None], sin[None], mask, cs
        )

    expected = numba_cpu.transformer.transformer_stack(
        layers, transformer.QWEN3, cfg, x, cos[None], sin[None], mask, caches()
    )
    assert expected is not NotImplemented
    other = dict(weights)
    np.testing.assert_array_equal(
        twin([layers[0], transformer.layer_views(other, "model.layers.", 2)[1]], caches()), expected
    )
    uneven = caches((0, 1))
    twin(layers, uneven)
    assert [c.length for c in uneven] == [1, 2]
    norm = weights["model.layers.1.input_layernorm.weight"].copy()
    norm.flags.writeable = False
    weights["model.layers.1.input_layernorm.weight"] = norm
    np.testing.assert_array_equal(twin(layers, caches()), expected)


# the prompts by the rows kernel, by the block kernel (or the tiles): a row alone takes the kernel of its own
# length, the batch that of the longest, so each row's length is in its batch's kernel's range: up to
# TILES_MIN_ROWS - 1 positions the few rows' tiles where granted, else the rows kernel; from there to
# MATVEC_MAX_ROWS the prompt's tiles where granted, else the rows kernel; more, the tiles or the block kernel
_FEW, _MANY = numba_cpu.linear.TILES_MIN_ROWS, numba_cpu.linear.MATVEC_MAX_ROWS


@pytest.mark.parametrize(
    "lengths", [(_FEW - 1, _FEW - 2, 1), (_MANY, (_FEW + _MANY) // 2, _FEW), (_MANY + 4, _MANY + 2, _MANY + 1)]
)
def test_fused_batch_rows_have_the_bits_of_each_row_alone(lengths):
    """A left-padded batch of three rows through the fused stack (a prompt, then three one-position steps,
    the last layer for the last position alone as generation runs it) gives each row the bits of the same
    row run alone, unpadded: every weight read once for the batch's rows, each row's sums the same.  The
    batch also agrees with the reference stack over the padded batch (float32 bound)."""
    C, H, G, D, F = 32, 4, 2, 8, 64
    weights, layers, cfg = random_qwen3_stack(31, 2, C, H, G, D, F)
    B, T, steps = len(lengths), max(lengths), 3  # the batch left-pads the rows' prompts to the longest
    xs = np.random.default_rng(T).standard_normal((B, T + steps, C)).astype(np.float32)
    valid = np.ones((B, T + steps), bool)
    positions = np.zeros((B, T + steps), np.int64)
    for b, n in enumerate(lengths):
        valid[b, : T - n] = False
        positions[b, T - n :] = np.arange(n + steps)

    def run(x_btc, positions_bt, valid_bs, fused: bool):
        """The prompt, then the steps: each call's output for the last position of every row."""
        caches = [transformer.KVCache(x_btc.shape[0], G, D, np.float32, capacity=2) for _ in layers]
        stack = numba_cpu.transformer.transformer_stack if fused else transformer.transformer_stack.reference
        outs = []
        for start, stop in ((0, x_btc.shape[1] - steps),) + tuple(
            (s, s + 1) for s in range(x_btc.shape[1] - steps, x_btc.shape[1])
        ):
            cos, sin = nn.rope_cos_sin(positions_bt[:, start:stop], D, 10000.0, np.float32)
            key_valid = None if valid_bs[:, :stop].all() else valid_bs[:, :stop]
            mask = nn.AttentionMask(nn.arange(start, stop), nn.arange(stop), key_valid_bs=key_valid)
            with kernels.use_backend("numba"):
                y = stack(
                    layers, transformer.QWEN3, cfg, x_btc[:, start:stop], cos, sin, mask, caches, 1e-6, NULL, True
                )
            assert y is not NotImplemented
            outs.append(y[:, -1])
        return np.stack(outs, axis=1)  # [B, 1 + steps, C]

    from refimpl.recorder import NULL_RECORDER as NULL

    batch = run(xs, positions, valid, fused=True)
    for b, n in enumerate(lengths):
        alone = run(xs[b : b + 1, T - n :], positions[b : b + 1, T - n :], valid[b : b + 1, T - n :], fused=True)
        np.testing.assert_array_equal(batch[b], alone[0], err_msg=f"row {b}")
    np.testing.assert_allclose(batch, run(xs, positions, valid, fused=False), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("packed", [False, True])
def test_the_kept_stack_follows_new_words_new_tensors_and_grown_caches(packed, monkeypatch):
    """The stack's memo (``_StackMemo``, kept from step to step with the caches) against no memo, over steps on
    the same caches between which a matrix's words are swapped in place (as the huge-page copy does, other
    words here so that stale ones would show), a norm is replaced in the weights dict, and the caches grow
    (capacity 2): the same bits at every step, the words the kernel reads the new ones, and the arguments
    made again only where something changed.  ``packed``: read-packed matrices of read-only words (the code
    predictor's), whose packed words are kept with the words they were made of."""
    C, H, G, D, F = 64, 4, 2, 16, 128  # (columns a multiple of 64: packable)
    pw = numba_cpu.packed_words
    made = []
    weight_arguments = numba_cpu.transformer._weight_arguments
    monkeypatch.setattr(numba_cpu.transformer, "_weight_arguments", lambda *a: made.append(1) or weight_arguments(*a))

    def words(seed, shape):
        bits = float32_to_bf16_bits(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) / 8)
        bits.flags.writeable = not packed
        return bits

    def run():
        weights, layers, cfg = random_qwen3_stack(51, 2, C, H, G, D, F)
        if packed:
            names = [n for n, m in weights.items() if isinstance(m, BF16Matrix)]
            weights.update(bf16.mark_read_packed(weights, names))
            for n in names:
                weights[n].bits = np.frombuffer(weights[n].bits.tobytes(), np.uint16).reshape(weights[n].shape)
        caches = [transformer.KVCache(1, G, D, np.float32, capacity=2) for _ in layers]
        made.clear()
        outs, swapped = [], None
        for step in range(5):
            q = weights["model.layers.1.self_attn.q_proj.weight"]
            if step == 2:  # other words, in place
                q.bits = swapped = words(step, q.shape)
            if step == 3:  # a tensor replaced
                weights["model.layers.0.post_attention_layernorm.weight"] = weights[
                    "model.layers.0.post_attention_layernorm.weight"
                ] * np.float32(1.5)
            x = np.random.default_rng(step).standard_normal((1, 1, C)).astype(np.float32)
            cos, sin = nn.rope_cos_sin(np.arange(step, step + 1), D, 10000.0, np.float32)
            mask = nn.AttentionMask(nn.arange(step, step + 1), nn.arange(step + 1))
            y = numba_cpu.transformer.transformer_stack(
                layers, transformer.QWEN3, cfg, x, cos[None], sin[None], mask, caches, 1e-6, None, True
            )
            outs.append(y)
            if step == 2:
                kept = numba_cpu.transformer._memo_of(layers, caches)
                q_l = kept.weight_arguments(True)[1] if kept is not None else None
                reads = pw.packed_words(q) if packed and pw.USE_PACKED else swapped
                assert kept is None or q_l[1] is reads  # the new words, or their packing
        return outs, caches

    kept_outs, caches = run()
    assert made == [1, 1, 1]  # the first step, the words swapped, the tensor replaced
    assert caches[0].k.shape[2] >= 5  # (the caches grew)
    monkeypatch.setattr(numba_cpu.transformer, "_memo_of", lambda layers, caches: None)
    fresh_outs, _ = run()
    assert len(made) == 5
    for kept, fresh in zip(kept_outs, fresh_outs, strict=True):
        np.testing.assert_array_equal(kept, fresh)


def test_a_stack_memo_lives_as_long_as_its_first_cache():
    """The memo is kept by a weak reference to the stack's first cache: no memo keeps a cache (with its
    arrays, or a model's weights) alive, and a frame's caches take their memo with them."""
    import gc
    import weakref

    C, H, G, D, F = 32, 4, 2, 8, 64
    weights, layers, cfg = random_qwen3_stack(61, 2, C, H, G, D, F)
    caches = [transformer.KVCache(1, G, D, np.float32, capacity=2) for _ in layers]
    x = np.zeros((1, 1, C), np.float32)
    cos, sin = nn.rope_cos_sin(np.arange(0, 1), D, 10000.0, np.float32)
    mask = nn.AttentionMask(nn.arange(0, 1), nn.arange(1))
    y = numba_cpu.transformer.transformer_stack(layers, transformer.QWEN3, cfg, x, cos[None], sin[None], mask, caches)
    assert y is not NotImplemented and caches[0] in numba_cpu.transformer._MEMOS
    first = weakref.ref(caches[0])
    del caches
    gc.collect()
    assert first() is None
