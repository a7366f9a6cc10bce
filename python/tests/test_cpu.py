"""The Python package's CPU-side tests: parsing and its errors, launch validation, PTX for
every example, and the torch op layer traced with fake tensors (no GPU needed)."""

import pathlib

import pytest
import torch

import attnc

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "dsl-examples").glob("*.attn"))


def test_every_example_loads_and_prints_back():
    assert len(EXAMPLES) >= 10
    for path in EXAMPLES:
        a = attnc.load(path)
        again = attnc.compile(a.source, name=path.name)
        assert again.spec == a.spec, path
        assert a.layout in ("contiguous", "varlen", "paged")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_compiles_to_ptx_without_a_gpu(path):
    ptx = attnc.load(path).ptx("sm_90a")
    assert ".target sm_90a" in ptx and ".entry" in ptx


def test_a_syntax_error_names_file_line_column_and_caret():
    src = "attention x {\n  dtype bf16\n  head_dim 128\n  heads 4\n  mask causal &&\n}\n"
    with pytest.raises(attnc.AttncSyntaxError) as info:
        attnc.compile(src, name="bad.attn")
    e = info.value
    assert (e.file, e.line, e.column) == ("bad.attn", 5, 17)
    assert "expected an expression" in e.message
    assert "bad.attn:5:17" in str(e) and "mask causal &&" in str(e) and "^" in str(e)
    assert isinstance(e, ValueError)


def test_an_invalid_variant_is_a_syntax_error_too():
    src = "attention x {\n  dtype bf16\n  head_dim 100\n  heads 4\n}\n"
    with pytest.raises(attnc.AttncSyntaxError) as info:
        attnc.compile(src, name="dims.attn")
    assert info.value.file == "dims.attn" and "head_dim" in str(info.value)


def _doc():
    a = attnc.load(ROOT / "dsl-examples" / "document_mask.attn")
    q = torch.empty(2, 100, 32, 128, dtype=torch.bfloat16)
    k = torch.empty(2, 100, 8, 128, dtype=torch.bfloat16)
    doc = torch.zeros(2, 100, dtype=torch.int32)
    return a, q, k, doc


def test_valid_arguments_pass_host_validation():
    a, q, k, doc = _doc()
    a.check(q, k, k, torch.empty_like(q), aux={"doc": doc})


@pytest.mark.parametrize(
    "case, expected",
    [
        ("q_dtype", "q: dtype is f32, expected bf16"),
        ("q_head_dim", "q: dim 3 (head_dim_qk) is 64, expected 128"),
        ("q_layout", "GQA"),
        ("inner_stride", "the last dimension must have unit stride"),
        ("aux_missing", "aux tensor `doc`: missing"),
        ("aux_shape", "aux tensor `doc`"),
        ("out_shape", "o: dim 1"),
        ("unknown_param", "param `window`"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_them(case, expected):
    a, q, k, doc = _doc()
    o = torch.empty_like(q)
    args = dict(q=q, k=k, v=k, out=o, aux={"doc": doc})
    if case == "q_dtype":
        args["q"] = q.float()
    elif case == "q_head_dim":
        args["q"] = q[..., :64]
    elif case == "q_layout":
        args["q"] = q.transpose(1, 2)
    elif case == "inner_stride":
        args["k"] = torch.empty(2, 100, 8, 256, dtype=torch.bfloat16)[..., ::2]
    elif case == "aux_missing":
        args["aux"] = None
    elif case == "aux_shape":
        args["aux"] = {"doc": doc[:, :50]}
    elif case == "out_shape":
        args["out"] = o[:, :50]
    elif case == "unknown_param":
        with pytest.raises(ValueError, match=expected):
            a.check(q, k, k, o, aux={"doc": doc}, params={"window": 3})
        return
    with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        a.check(args["q"], args["k"], args["v"], args["out"], aux=args["aux"])


class _FakeCudaTensor:
    """The attributes the Rust side reads of a torch CUDA tensor, without a GPU."""

    def __init__(self, shape, ptr, dtype=torch.bfloat16, strides=None):
        self.shape, self.dtype, self.is_cuda, self._ptr = torch.Size(shape), dtype, True, ptr
        self._strides = strides or torch.empty(shape, device="meta").stride()

    def get_device(self):
        return 0

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return tuple(self._strides)


def test_torch_tensors_are_read_and_checked_on_the_rust_side():
    # The package hands torch tensors to Rust as they are: each is read there and goes
    # through the launch validation, naming the argument.
    a = attnc.load(ROOT / "dsl-examples" / "causal.attn")
    h, d = a.spec["q_heads"], a.spec["head_dim_qk"]
    base = 0x7F00_0000_0000

    def fake(i, **kw):
        return _FakeCudaTensor((1, 7, h, d), base + i * (1 << 24), **kw)

    q, k, v, o = (fake(i) for i in range(4))
    a._variant.check_forward(q, k, v, o)
    with pytest.raises(ValueError, match="q: must be a CUDA tensor, found device cpu"):
        a._variant.check_forward(torch.zeros(1, 7, h, d, dtype=torch.bfloat16), k, v, o)
    with pytest.raises(ValueError, match="k: dtype torch.float64 is not supported"):
        a._variant.check_forward(q, fake(1, dtype=torch.float64), v, o)
    with pytest.raises(ValueError, match="v: negative strides are not supported"):
        a._variant.check_forward(q, k, fake(2, strides=(7 * h * d, h * d, d, -1)), o)
    with pytest.raises(ValueError, match="o: expected a CUDA tensor .* found list"):
        a._variant.check_forward(q, k, v, [1, 2])
    with pytest.raises(ValueError, match="^o: "):
        a._variant.check_forward(q, k, v, _FakeCudaTensor((1, 7, h, d), base + (3 << 24) + 2))


def test_calls_with_cpu_tensors_are_refused_before_anything_launches():
    a, q, k, doc = _doc()
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        a(q, k, k, aux={"doc": doc})
    with pytest.raises(ValueError, match="aux tensor `doc`: missing"):
        a(q, k, k)
    with pytest.raises(ValueError, match="declares no such aux tensor"):
        a(q, k, k, aux={"doc": doc, "other": doc})


def test_the_ops_are_registered():
    assert hasattr(torch.ops.attnc, "forward") and hasattr(torch.ops.attnc, "backward")


def _fake_trace(fn, *args):
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*args)


def _targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_the_forward_and_backward_trace_with_fake_tensors():
    a = attnc.load(ROOT / "dsl-examples" / "alibi_learned.attn")

    def step(q, k, v, slopes):
        o = a(q, k, v, aux={"slopes": slopes})
        return torch.autograd.grad(o.float().sum(), (q, k, v, slopes))

    q = torch.randn(2, 77, 16, 128, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 91, 16, 128, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 91, 16, 128, dtype=torch.bfloat16, requires_grad=True)
    slopes = torch.rand(16, requires_grad=True)
    gm = _fake_trace(step, q, k, v, slopes)
    targets = _targets(gm)
    assert "attnc.forward.default" in targets and "attnc.backward.default" in targets


def test_a_shard_traces_with_its_positions_in_both_ops():
    a = attnc.load(ROOT / "dsl-examples" / "alibi_learned.attn")

    def step(q, k, v, slopes):
        o = a(q, k, v, aux={"slopes": slopes}, positions=(100, 40, 300, 300))
        return torch.autograd.grad(o.float().sum(), (q, k, v, slopes))

    q = torch.randn(1, 77, 16, 128, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 91, 16, 128, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 91, 16, 128, dtype=torch.bfloat16, requires_grad=True)
    gm = _fake_trace(step, q, k, v, torch.rand(16, requires_grad=True))
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and str(n.target).startswith("attnc.")]
    assert {str(n.target) for n in calls} == {"attnc.forward.default", "attnc.backward.default"}
    assert all(list(n.args[-1]) == [100, 40, 300, 300, 1] for n in calls), [n.args[-1] for n in calls]


def test_sinks_and_varlen_have_fake_shapes():
    s = attnc.load(ROOT / "dsl-examples" / "sinks.attn")
    q = torch.randn(1, 33, 64, 64, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 33, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    sinks = torch.zeros(64, requires_grad=True)

    def step(q, k, sinks):
        o = s(q, k, k, sinks=sinks)
        return (o,) + torch.autograd.grad(o.float().sum(), (q, k, sinks))

    gm = _fake_trace(step, q, k, sinks)
    outs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    shapes = [tuple(n.meta["val"].shape) for n in outs]
    assert shapes == [(1, 33, 64, 64), (1, 33, 64, 64), (1, 33, 8, 64), (64,)]

    v = attnc.load(ROOT / "dsl-examples" / "varlen_causal.attn")
    qv = torch.randn(50, 28, 128, dtype=torch.bfloat16)
    kv = torch.randn(60, 4, 128, dtype=torch.bfloat16)
    cu_q = torch.tensor([0, 20, 50], dtype=torch.int32)
    cu_k = torch.tensor([0, 25, 60], dtype=torch.int32)
    gm = _fake_trace(lambda q, k, cq, ck: v(q, k, k, cu_seqlens_q=cq, cu_seqlens_k=ck, return_lse=True),
                     qv, kv, cu_q, cu_k)
    outs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    assert [tuple(n.meta["val"].shape) for n in outs] == [(50, 28, 128), (28, 50)]


def test_torch_compile_traces_the_op_in_one_graph():
    """Dynamo captures the call as one graph (fullgraph: a break would raise)."""
    a = attnc.load(ROOT / "dsl-examples" / "causal.attn")
    spec = a.spec
    h, d = spec["q_heads"], spec["head_dim_qk"]

    class Block(torch.nn.Module):
        def forward(self, q, k, v):
            return a(q, k, v) * 2

    q = torch.randn(1, 16, h, d, dtype=torch.bfloat16)
    ep = torch.export.export(Block(), (q, q, q), strict=True)
    assert "attnc.forward.default" in _targets(ep.graph_module)


def test_non_torch_arrays_need_forward_into():
    a, q, k, doc = _doc()
    with pytest.raises(TypeError, match="forward_into"):
        a(object(), k, k)


def _flex_inputs(a, batch, seqlen):
    from attnc.compare import _aux_tensors

    gen = torch.Generator().manual_seed(0)
    aux = _aux_tensors(a, batch, seqlen, seqlen, "cpu", gen)
    params = {n: (3 if ty == "Int" else 0.5) for n, ty in a.params}
    lens = torch.full((batch,), seqlen, dtype=torch.int32)
    return aux, params, lens


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_has_flex_functions_that_run(path):
    """The generated FlexAttention module of every example runs FlexAttention (eager, CPU)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from attnc.compare import flex_functions

    a = attnc.load(path)
    ns, unsupported = flex_functions(a)
    if a.spec["sinks"]:
        assert unsupported, "sinks have no Flex form and must be reported"
        return
    b, s = 2, 40
    aux, params, lens = _flex_inputs(a, b, s)
    mask_mod, score_mod = ns["make"](lens, lens, params, aux)
    hq, hkv = a.spec["q_heads"], a.spec["kv_heads"]
    d, dv = a.spec["head_dim_qk"], a.spec["head_dim_v"]
    q, k, v = torch.randn(b, hq, s, d), torch.randn(b, hkv, s, d), torch.randn(b, hkv, s, dv)
    bm = None if mask_mod is None else create_block_mask(mask_mod, b, hq, s, s, device="cpu")
    o = flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, scale=ns["SCALE"], enable_gqa=ns["ENABLE_GQA"])
    assert o.shape == (b, hq, s, dv)


def test_flex_functions_mean_what_the_variant_means():
    """Causal and the document mask through the generated functions equal a dense masked
    softmax (CPU, f32)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from attnc.compare import flex_functions

    doc = attnc.load(ROOT / "dsl-examples" / "document_mask.attn")
    ns, _ = flex_functions(doc)
    b, s = 2, 50
    ids = torch.sort(torch.randint(0, 3, (b, s), dtype=torch.int32), dim=1).values
    lens = torch.full((b,), s, dtype=torch.int32)
    mask_mod, _ = ns["make"](lens, lens, {}, {"doc": ids})
    q, k, v = torch.randn(b, 32, s, 128), torch.randn(b, 8, s, 128), torch.randn(b, 8, s, 128)
    bm = create_block_mask(mask_mod, b, 32, s, s, device="cpu")
    o = flex_attention(q, k, v, block_mask=bm, scale=ns["SCALE"], enable_gqa=True)
    allowed = (ids[:, None, :, None] == ids[:, None, None, :]) & torch.ones(s, s, dtype=torch.bool).tril()
    kk, vv = k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)
    logits = (q @ kk.transpose(-1, -2) * ns["SCALE"]).masked_fill(~allowed, float("-inf"))
    want = torch.softmax(logits, -1) @ vv
    assert torch.allclose(o, want, atol=1e-4, rtol=1e-4)

    soft = attnc.load(ROOT / "dsl-examples" / "grok_softcap.attn")
    ns, _ = flex_functions(soft)
    _, score_mod = ns["make"](lens, lens, {}, {})
    x = torch.linspace(-200, 200, 11)
    assert torch.allclose(score_mod(x, 0, 0, 0, 0), 30.0 * torch.tanh(x / 30.0))  # its `score` line


def test_a_variant_declaring_lse_always_gets_an_lse_buffer():
    """`lse` in the spec: the kernel writes it, so even a no-grad call without
    return_lse passes one (traced: the op is asked for it)."""
    vl = attnc.load(ROOT / "dsl-examples" / "varlen_causal.attn")
    qv = torch.randn(50, 28, 128, dtype=torch.bfloat16)
    kv = torch.randn(60, 4, 128, dtype=torch.bfloat16)
    cu_q = torch.tensor([0, 20, 50], dtype=torch.int32)
    cu_k = torch.tensor([0, 25, 60], dtype=torch.int32)
    gm = _fake_trace(lambda q, k, cq, ck: vl(q, k, k, cu_seqlens_q=cq, cu_seqlens_k=ck), qv, kv, cu_q, cu_k)
    call = [n for n in gm.graph.nodes if str(n.target) == "attnc.forward.default"][0]
    assert call.args[13] is True, call.args


class _StubKernel:
    """Records what the Python glue hands to the Rust kernel, so the glue runs without a GPU."""

    def __init__(self):
        self.calls = []

    def forward_torch(self, q, k, v, stream, need_lse, extras):
        self.calls.append(("forward", extras))
        b, s, h, _ = q.shape
        return q.new_empty((b, s, h, v.shape[-1])), q.new_empty((b, h, s), dtype=torch.float32) if need_lse else None

    def backward(self, q, k, v, o, lse, d_out, dq, dk, dv, stream, extras):
        self.calls.append(("backward", extras))

    def receipt_text(self):
        return f"stub receipt after {len(self.calls)} calls"


def _stubbed(monkeypatch, attn):
    import attnc.torch as at

    stub = _StubKernel()
    monkeypatch.setattr(at, "_stream", lambda t: 0)
    monkeypatch.setattr(at, "_device", lambda q: 0)
    monkeypatch.setattr(type(attn), "kernel", lambda self, device: stub)
    return at, stub


def test_the_backward_glue_passes_the_determinism_flag_without_other_extras(monkeypatch):
    # A variant with no aux, params or sinks: the forward passes no extras dict at all, and
    # the backward must still pass its flag (regression: it indexed a None).
    a = attnc.load(ROOT / "dsl-examples" / "causal.attn")
    at, stub = _stubbed(monkeypatch, a)
    h, d = a.spec["q_heads"], a.spec["head_dim_qk"]
    q = torch.randn(1, 7, h, d, dtype=torch.bfloat16)
    o, lse = at._forward_impl(a, q, q, q, [], None, None, None, None, None, [], [], 0, True)
    at._backward_impl(a.key, q, q, q, o, lse, o, [], None, None, None, [], [], True)
    assert stub.calls == [("forward", None), ("backward", {"deterministic": True})]


def test_two_loads_of_one_file_share_the_last_receipt(monkeypatch):
    first = attnc.load(ROOT / "dsl-examples" / "causal.attn")
    second = attnc.load(ROOT / "dsl-examples" / "causal.attn")
    at, stub = _stubbed(monkeypatch, first)
    h, d = first.spec["q_heads"], first.spec["head_dim_qk"]
    q = torch.randn(1, 7, h, d, dtype=torch.bfloat16)
    # The op finds its variant by key (the first object); both objects see the receipt.
    at._forward_impl(at._variant(second.key), q, q, q, [], None, None, None, None, None, [], [], 0, False)
    assert first.receipt_text() == second.receipt_text() == "stub receipt after 1 calls"


@pytest.mark.parametrize("path", ["eager", "op"])
def test_autograd_hands_the_forwards_block_mask_to_the_backward(monkeypatch, path):
    # One mask object serves both directions: the backward builds its classes from it once.
    a = attnc.load(ROOT / "dsl-examples" / "causal.attn")
    at, stub = _stubbed(monkeypatch, a)

    class Mask:
        pass

    mask = Mask()
    key = at.block_mask_key(mask)
    h, d = a.spec["q_heads"], a.spec["head_dim_qk"]
    q = torch.randn(1, 7, h, d, dtype=torch.bfloat16, requires_grad=True)
    if path == "eager":
        o, _ = at._EagerAttention.apply(a.key, q, q, q, None, None, None, [], [], False, key, None)
    else:
        o, _ = torch.ops.attnc.forward(a.key, q, q, q, [], None, None, None, None, None, [], [], 0, True, False, key, [])
    o.float().sum().backward()
    assert stub.calls == [("forward", {"block_mask": mask}),
                          ("backward", {"deterministic": False, "block_mask": mask})]


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_sequence_shards_round_trip_and_balance_causal_work(layout):
    from attnc.cp import shard_sequence, unshard_sequence

    world = 4
    x = torch.arange(2 * 64 * 3).view(2, 64, 3)
    shards = [shard_sequence(x, r, world, layout) for r in range(world)]
    assert torch.equal(unshard_sequence(shards, layout), x)
    # Causal work per rank: the number of (q, k <= q) pairs of its rows.
    work = [int((s[0, :, 0] // 3 + 1).sum()) for s in shards]
    if layout == "zigzag":
        assert len(set(work)) == 1, work
    with pytest.raises(ValueError, match="equal chunks"):
        shard_sequence(torch.zeros(1, 30, 1), 0, world, layout)


def test_partial_softmaxes_merge_by_lse_into_the_whole():
    from attnc.cp import _merge

    torch.manual_seed(0)
    b, s, h, d, n = 2, 5, 3, 4, 12
    scores = torch.randn(b, h, s, n, dtype=torch.float64)
    scores[0, 0, 1, :7] = float("-inf")  # a row with no keys in the first part
    scores[1, 2, 3, :] = float("-inf")  # a row with no keys at all
    v = torch.randn(b, n, h, d, dtype=torch.float64)

    def part(lo, hi):
        sc = scores[..., lo:hi]
        lse = torch.logsumexp(sc, dim=-1)
        p = torch.exp(sc - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse).unsqueeze(-1))
        o = torch.einsum("bhsn,bnhd->bshd", p, v[:, lo:hi])
        return o, lse

    o_acc = torch.zeros(b, s, h, d, dtype=torch.float64)
    lse_acc = torch.full((b, h, s), float("-inf"), dtype=torch.float64)
    for lo, hi in [(0, 7), (7, 8), (8, 12)]:
        o_acc, lse_acc = _merge(o_acc, lse_acc, *part(lo, hi))
    o_all, lse_all = part(0, n)
    assert torch.allclose(o_acc, o_all) and torch.equal(torch.isinf(lse_acc), torch.isinf(lse_all))
    finite = ~torch.isinf(lse_all)
    assert torch.allclose(lse_acc[finite], lse_all[finite])


def test_a_variant_with_int_params_traces_through_both_ops():
    # Autograd takes a non-empty list of ints as one leaf: the backward's entry is None.
    a = attnc.load(ROOT / "dsl-examples" / "prefix_lm.attn")
    h, d = a.spec["q_heads"], a.spec["head_dim_qk"]

    def step(q, k, v):
        o = a(q, k, v, params={"prefix": 5})
        return torch.autograd.grad(o.float().sum(), (q, k, v))

    q, k, v = (torch.randn(1, 33, h, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    targets = _targets(_fake_trace(step, q, k, v))
    assert "attnc.forward.default" in targets and "attnc.backward.default" in targets


def test_shard_pairs_the_mask_rules_out_are_skipped():
    from attnc.cp import _Pairs, last_stats

    causal = attnc.load(ROOT / "dsl-examples" / "causal.attn")
    p = _Pairs(causal, 100, 400, {})
    assert p.runs(1, 0) and p.runs(1, 1) and not p.runs(0, 1) and not p.runs(1, 3)
    assert last_stats == {"pairs": 4, "skipped": 2}
    # A document mask: causality still rules pairs out, document ids (unknown here) do not.
    doc = attnc.load(ROOT / "dsl-examples" / "document_mask.attn")
    assert doc._variant.classify_block(0, 100, 100, 200, 400, 400) == "empty"
    assert doc._variant.classify_block(100, 200, 0, 100, 400, 400) == "partial"
    # A chunk pair that holds the sink runs whatever the mask says.
    sinks = attnc.load(ROOT / "dsl-examples" / "sinks.attn")
    if sinks._variant.classify_block(0, 100, 0, 100, 400, 400) != "empty":
        assert _Pairs(sinks, 100, 400, {}).runs(0, 0)
    with pytest.raises(ValueError, match="non-empty ranges"):
        causal._variant.classify_block(5, 5, 0, 10, 400, 400)


def test_a_shard_is_validated_against_its_global_lengths():
    a, q, k, doc = _doc()
    out = torch.empty_like(q)
    b, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    whole_doc = torch.zeros(b, sk + 50, dtype=torch.int32)
    a.check(q, k, k, out, aux={"doc": whole_doc}, positions=(10, 50, sq + 10, sk + 50))
    with pytest.raises(ValueError, match="past the global seqlen_k"):
        a.check(q, k, k, out, aux={"doc": whole_doc}, positions=(10, 51, sq + 10, sk + 50))
    with pytest.raises(ValueError, match="expected"):
        a.check(q, k, k, out, aux={"doc": doc}, positions=(10, 50, sq + 10, sk + 50))


def test_a_varlen_shard_is_validated_sequence_by_sequence():
    from attnc.torch import SequencePositions

    a = attnc.load(ROOT / "dsl-examples" / "varlen_causal.attn")
    h, hkv, d = a.spec["q_heads"], a.spec["kv_heads"], a.spec["head_dim_qk"]
    cu_q = torch.tensor([0, 5, 12], dtype=torch.int32)
    cu_k = torch.tensor([0, 40, 90], dtype=torch.int32)
    q = torch.empty(12, h, d, dtype=torch.bfloat16)
    k = torch.empty(90, hkv, d, dtype=torch.bfloat16)
    lse = torch.empty(h, 12, dtype=torch.float32)
    frames = torch.tensor([[10, 100, 20, 200], [0, 0, 7, 50]], dtype=torch.int32)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, lse=lse if a.spec["lse"] else None)
    a.check(q, k, k, torch.empty_like(q), positions=SequencePositions(frames), **kw)
    short = frames.clone()
    short[1, 3] = 49
    with pytest.raises(ValueError, match="sequence 1"):
        a.check(q, k, k, torch.empty_like(q), positions=SequencePositions(short), **kw)


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world", [2, 3])
def test_varlen_shards_hold_each_sequences_chunks_by_slot(layout, world):
    from attnc.cp import _VarlenPlan, shard_varlen

    per = 2 if layout == "zigzag" else 1
    m = per * world
    cu = torch.tensor([0, 8, 8, 27, 40, 42], dtype=torch.int32)  # lengths 8, 0, 19, 13, 2: uneven cuts
    x = torch.arange(42)
    plan = _VarlenPlan(cu, world, layout)
    assert plan.lengths == [8, 0, 19, 13, 2]
    seen = []
    for rank in range(world):
        local = shard_varlen(x, cu, rank, world, layout)
        assert len(local) == plan.rows(rank)
        seen.append(local)
        for slot, cid in enumerate(plan.chunks_of(rank)):
            # Chunk cid of every sequence: rows c·n//m .. (c+1)·n//m of it, sizes within one.
            want = torch.cat([x[s + cid * n // m:s + (cid + 1) * n // m] for s, n in zip(cu[:-1].tolist(), plan.lengths)])
            assert torch.equal(local[plan.slot_rows(rank, slot)], want)
            cu_c = plan.cu(cid)
            assert int(cu_c[-1]) == len(want) and cu_c.dtype == torch.int32
            frame = plan.frame(cid, 0)
            assert frame[:, 0].tolist() == [cid * n // m for n in plan.lengths]
            assert frame[:, 2].tolist() == plan.lengths
    # Every row of the batch on exactly one rank.
    assert torch.equal(torch.sort(torch.cat(seen)).values, x)
    with pytest.raises(ValueError, match="cu_seqlens"):
        _VarlenPlan(torch.tensor([0, 5, 3], dtype=torch.int32), world, layout)


def test_ready_first_reaches_the_kernel_request(monkeypatch):
    # The extension takes the flag (its signature), and each Attention passes its own.
    assert "ready_first" in attnc._attnc.kernel.__text_signature__
    seen = []

    def kernel(variant, device, family, ready_first):
        seen.append((device, family, ready_first))
        return object()

    monkeypatch.setattr(attnc._attnc, "kernel", kernel)
    attnc.load(ROOT / "dsl-examples" / "causal.attn", ready_first=True).kernel(0)
    attnc.compile("attention m {\n dtype bf16\n head_dim 64\n heads 4\n}\n").kernel(1)
    assert seen == [(0, "auto", True), (1, "auto", False)]
