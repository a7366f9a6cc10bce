"""Context parallelism: attention over sequences sharded across the ranks of a
``torch.distributed`` process group (NCCL), for every variant.

Each rank holds its shard of Q, K and V (``[batch, local_seqlen, heads, head_dim]``) and gets
its rows of O back. Masks and score modifications see global positions: every launch passes
the shard's place in the global sequence (``positions=``), so a causal, windowed or document
mask means on a shard what it means on the whole. Aux tensors are the global ones: every
rank passes the same whole tensor (they are per-token metadata, small next to K and V).

Two strategies (docs/context-parallel.md weighs them):

- ``"allgather"``: gather K and V once, run this rank's query chunks against all of them
  (one launch per chunk, nothing to merge); the backward reduce-scatters dK and dV.
- ``"ring"``: pass K/V chunks around the ring (NCCL send/recv of the next chunk posted
  before the current one computes, so the transfer overlaps), merge the partial outputs
  by their LSE in f32; the backward runs each step against the merged O and LSE and sends
  dK/dV along with their chunk until they are home.

Two layouts: ``"contiguous"`` (rank r holds rows [r·S, (r+1)·S)) and ``"zigzag"`` (the
sequence in 2·W equal chunks; rank r holds chunks r and 2·W−1−r, so a causal mask gives
every rank the same work).
"""

import torch
import torch.distributed as dist

from .torch import _aux_list, _backward_impl, _forward_impl, _params

__all__ = ["context_parallel_attention", "shard_sequence", "unshard_sequence", "shard_varlen", "last_stats"]

# The last call's chunk pairs: computed, and skipped because the mask rules them out.
last_stats = {"pairs": 0, "skipped": 0}


class _Pairs:
    """Which (query chunk, key chunk) pairs the mask rules out entirely, by the interval
    analysis over positions and int params (aux values unknown): no launch and no merge
    for them, forward or backward. A pair that takes the sink always runs."""

    def __init__(self, attn, c, total, int_params):
        self.attn, self.c, self.total, self.int_params, self.memo = attn, c, total, int_params, {}
        self.sinks = attn.spec["sinks"]
        last_stats.update(pairs=0, skipped=0)

    def runs(self, qid, kid):
        if (qid, kid) not in self.memo:
            c = self.c
            cls = self.attn._variant.classify_block(qid * c, (qid + 1) * c, kid * c, (kid + 1) * c, self.total,
                                                    self.total, self.int_params)
            self.memo[(qid, kid)] = cls != "empty" or (self.sinks and kid == 0)
        run = self.memo[(qid, kid)]
        last_stats["pairs"] += 1
        last_stats["skipped"] += 0 if run else 1
        return run


def _chunk_ids(layout, rank, world):
    if layout == "contiguous":
        return [rank]
    if layout == "zigzag":
        return [rank, 2 * world - 1 - rank]
    raise ValueError(f"layout: expected 'contiguous' or 'zigzag', found {layout!r}")


def _chunks_per_rank(layout):
    return 1 if layout == "contiguous" else 2


def shard_sequence(x, rank, world, layout="zigzag", dim=1):
    """This rank's shard of a whole-sequence tensor (sequence along ``dim``)."""
    n = world * _chunks_per_rank(layout)
    parts = x.chunk(n, dim=dim)
    if len(parts) != n or any(p.shape[dim] != parts[0].shape[dim] for p in parts):
        raise ValueError(f"the sequence length {x.shape[dim]} must split into {n} equal chunks")
    return torch.cat([parts[c] for c in _chunk_ids(layout, rank, world)], dim=dim)


def unshard_sequence(shards, layout="zigzag", dim=1):
    """The whole-sequence tensor from every rank's shard (in rank order)."""
    world = len(shards)
    per = _chunks_per_rank(layout)
    chunks = {}
    for r, s in enumerate(shards):
        for c, part in zip(_chunk_ids(layout, r, world), s.chunk(per, dim=dim)):
            chunks[c] = part
    return torch.cat([chunks[c] for c in range(world * per)], dim=dim)


def _merge(o_acc, lse_acc, o, lse):
    """Two partial softmaxes over disjoint keys, by their LSE (f32). O ``[b, s, h, d]``,
    LSE ``[b, h, s]``; rows without keys on one side (LSE −∞) take the other."""
    lse_new = torch.logaddexp(lse_acc, lse)
    lse_safe = torch.where(torch.isinf(lse_new), torch.zeros_like(lse_new), lse_new)
    w_acc = torch.exp(lse_acc - lse_safe).transpose(1, 2).unsqueeze(-1)
    w = torch.exp(lse - lse_safe).transpose(1, 2).unsqueeze(-1)
    return o_acc * w_acc + o.float() * w, lse_new


class _Ring:
    """Posts the send of what this rank holds to the next rank and the receive of the
    previous rank's, on NCCL's stream; ``wait`` before using what arrived."""

    def __init__(self, group, rank, world):
        self.group, self.rank, self.world = group, rank, world

    def shift(self, tensors, rows=None):
        """``rows``: the leading size of what arrives, when it differs from what leaves
        (varlen chunks of uneven sizes)."""
        nxt, prv = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        recv = [torch.empty_like(t) if rows is None else t.new_empty((rows, *t.shape[1:])) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, dist.get_global_rank(self.group, nxt) if self.group else nxt, self.group)
               for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, dist.get_global_rank(self.group, prv) if self.group else prv, self.group)
                for t in recv]
        return dist.batch_isend_irecv(ops), recv


class _ExtraGrads:
    """The sink and learnable aux gradients of one backward: summed over this rank's
    launches, then over the ranks (every rank holds a part)."""

    def __init__(self, attn, sinks, n_aux):
        self.sinks, self.learn = sinks is not None, [a[2] for a in attn.aux]
        self.dsinks, self.aux = None, [None] * n_aux

    def add(self, ds, aux_grads):
        if self.sinks:
            self.dsinks = ds if self.dsinks is None else self.dsinks + ds
        for j, g in enumerate(aux_grads):
            if self.learn[j]:
                self.aux[j] = g if self.aux[j] is None else self.aux[j] + g

    def reduced(self, group):
        """``(dsinks, *aux gradients)`` summed over ``group``."""
        for g in [self.dsinks, *self.aux]:
            if g is not None:
                dist.all_reduce(g, group=group)
        return (self.dsinks, *self.aux)


class _ContextParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, attn, cfg, q, k, v, sinks, *aux):
        group, strategy, layout, ints, floats, deterministic, int_params = cfg
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        per = _chunks_per_rank(layout)
        b, s_local = q.shape[0], q.shape[1]
        if s_local % per:
            raise ValueError(f"the local sequence ({s_local}) must hold {per} equal chunks for layout {layout!r}")
        c = s_local // per
        total = c * per * world
        mine = _chunk_ids(layout, rank, world)
        q_chunks = list(q.split(c, dim=1))
        aux = list(aux)

        def fwd(qc, kc, vc, q_off, k_off, take_sink):
            return _forward_impl(attn, qc, kc, vc, aux, sinks, None, None, None, None, ints, floats, 0, True, "",
                                 (q_off, k_off, total, total, take_sink))

        if strategy == "allgather":
            k_all = [torch.empty_like(k) for _ in range(world)]
            v_all = [torch.empty_like(v) for _ in range(world)]
            dist.all_gather(k_all, k.contiguous(), group=group)
            dist.all_gather(v_all, v.contiguous(), group=group)
            k_glob = unshard_sequence(k_all, layout).contiguous()
            v_glob = unshard_sequence(v_all, layout).contiguous()
            outs = [fwd(qc, k_glob, v_glob, cid * c, 0, True) for qc, cid in zip(q_chunks, mine)]
            o = [x[0] for x in outs]
            lse = [x[1] for x in outs]
            ctx.save_for_backward(q, k_glob, v_glob, sinks, *o, *lse, *aux)
        elif strategy == "ring":
            ring = _Ring(group, rank, world)
            pairs = _Pairs(attn, c, total, int_params)
            o_acc = [torch.zeros(qc.shape[:-1] + (v.shape[-1],), device=q.device, dtype=torch.float32)
                     for qc in q_chunks]
            lse_acc = [torch.full((b, q.shape[2], c), float("-inf"), device=q.device, dtype=torch.float32)
                       for _ in q_chunks]
            held_k, held_v = k.contiguous(), v.contiguous()
            for step in range(world):
                owner = (rank - step) % world
                pending = ring.shift([held_k, held_v]) if step + 1 < world else None
                for kc, vc, kid in zip(held_k.split(c, dim=1), held_v.split(c, dim=1),
                                       _chunk_ids(layout, owner, world)):
                    for i, (qc, qid) in enumerate(zip(q_chunks, mine)):
                        if not pairs.runs(qid, kid):
                            continue
                        # Exactly one key chunk (the first) takes the sink.
                        o_p, lse_p = fwd(qc, kc, vc, qid * c, kid * c, kid == 0)
                        o_acc[i], lse_acc[i] = _merge(o_acc[i], lse_acc[i], o_p, lse_p)
                if pending is not None:
                    for w in pending[0]:
                        w.wait()
                    held_k, held_v = pending[1]
            o = [x.to(q.dtype) for x in o_acc]
            lse = lse_acc
            ctx.save_for_backward(q, k, v, sinks, *o, *lse, *aux)
        else:
            raise ValueError(f"strategy: expected 'ring' or 'allgather', found {strategy!r}")
        ctx.attn, ctx.cfg, ctx.c, ctx.total, ctx.per, ctx.n_aux = attn, cfg, c, total, per, len(aux)
        return torch.cat(o, dim=1)

    @staticmethod
    def backward(ctx, d_o):
        attn, (group, strategy, layout, ints, floats, deterministic, int_params) = ctx.attn, ctx.cfg
        c, total, per = ctx.c, ctx.total, ctx.per
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        saved = ctx.saved_tensors
        q, k, v, sinks = saved[:4]
        o = saved[4:4 + per]
        lse = saved[4 + per:4 + 2 * per]
        aux = list(saved[4 + 2 * per:])
        mine = _chunk_ids(layout, rank, world)
        q_chunks = q.split(c, dim=1)
        do_chunks = d_o.contiguous().split(c, dim=1)

        def bwd(qc, kc, vc, oc, lc, doc, q_off, k_off, take_sink):
            return _backward_impl(attn.key, qc, kc, vc, oc, lc, doc.contiguous(), aux, sinks, None, None, ints,
                                  floats, deterministic, "", (q_off, k_off, total, total, take_sink))

        dq = [torch.zeros_like(qc, dtype=torch.float32) for qc in q_chunks]
        extra = _ExtraGrads(attn, sinks, len(aux))

        if strategy == "allgather":
            k_glob, v_glob = k, v
            dk_glob = torch.zeros_like(k_glob, dtype=torch.float32)
            dv_glob = torch.zeros_like(v_glob, dtype=torch.float32)
            for i, (qc, qid) in enumerate(zip(q_chunks, mine)):
                g = bwd(qc, k_glob, v_glob, o[i], lse[i], do_chunks[i], qid * c, 0, True)
                dq[i] += g[0].float()
                dk_glob += g[1].float()
                dv_glob += g[2].float()
                extra.add(g[3], g[4])
            # Each rank's dK, dV: the sum over ranks of its rows of dK_glob.
            dk = torch.empty_like(dk_glob[:, :per * c])
            dv = torch.empty_like(dv_glob[:, :per * c])
            dist.reduce_scatter(dk, [shard_sequence(dk_glob, r, world, layout).contiguous() for r in range(world)],
                                group=group)
            dist.reduce_scatter(dv, [shard_sequence(dv_glob, r, world, layout).contiguous() for r in range(world)],
                                group=group)
        else:
            ring = _Ring(group, rank, world)
            pairs = _Pairs(attn, c, total, int_params)
            held_k, held_v = k.contiguous(), v.contiguous()
            held_dk = torch.zeros_like(k, dtype=torch.float32)
            held_dv = torch.zeros_like(v, dtype=torch.float32)
            for step in range(world):
                owner = (rank - step) % world
                kcs, vcs = held_k.split(c, dim=1), held_v.split(c, dim=1)
                for j, kid in enumerate(_chunk_ids(layout, owner, world)):
                    for i, (qc, qid) in enumerate(zip(q_chunks, mine)):
                        if not pairs.runs(qid, kid):
                            continue
                        g = bwd(qc, kcs[j], vcs[j], o[i], lse[i], do_chunks[i], qid * c, kid * c, kid == 0)
                        dq[i] += g[0].float()
                        held_dk[:, j * c:(j + 1) * c] += g[1].float()
                        held_dv[:, j * c:(j + 1) * c] += g[2].float()
                        extra.add(g[3], g[4])
                # Pass the chunk on with its gradients; after the last step only the
                # gradients travel, and they arrive home.
                last = step + 1 == world
                works, recv = ring.shift([held_dk, held_dv] if last else [held_k, held_v, held_dk, held_dv])
                for w in works:
                    w.wait()
                if last:
                    held_dk, held_dv = recv
                else:
                    held_k, held_v, held_dk, held_dv = recv
            dk, dv = held_dk, held_dv
        dq = torch.cat(dq, dim=1).to(q.dtype)
        return (None, None, dq, dk.to(k.dtype), dv.to(v.dtype), *extra.reduced(group))


def context_parallel_attention(attn, q, k, v, *, group=None, strategy="ring", layout="zigzag", aux=None, params=None,
                               sinks=None, deterministic=False, cu_seqlens=None):
    """``attn`` over sequences sharded across ``group`` (``torch.distributed``, NCCL).

    ``q``, ``k``, ``v``: this rank's shard, ``[batch, local_seqlen, heads, head_dim]``, laid
    out by ``layout`` (``shard_sequence`` cuts a whole tensor that way). ``aux``: the
    variant's aux tensors, whole (every rank passes the same). Returns this rank's rows of
    O; autograd gives dQ, dK, dV of the shard (and sink and learnable aux gradients, summed
    over ranks). Varlen variants pass ``cu_seqlens`` (the global ``[batch + 1]`` offsets,
    the same on every rank) and this rank's packed rows (``shard_varlen``): every sequence
    is cut into the layout's chunks on its own, any lengths (ring strategy).
    """
    ints, floats = _params(attn, params)
    aux_list = _aux_list(attn, aux)
    int_names = [n for n, ty in attn.params if ty == "Int"]
    int_params = dict(zip(int_names, ints))
    cfg = (group, strategy, layout, ints, floats, bool(deterministic), int_params)
    if cu_seqlens is not None:
        cu = torch.as_tensor(cu_seqlens, dtype=torch.int32).cpu()
        return _ContextParallelVarlen.apply(attn, cfg, cu, q, k, v, sinks, *aux_list)
    return _ContextParallel.apply(attn, cfg, q, k, v, sinks, *aux_list)


# ---------------------------------------------------------------------------------------
# Varlen batches: every sequence is cut into the layout's chunks on its own, so a rank holds
# its chunks of every sequence, packed sequence by sequence (`shard_varlen`). Each launch
# covers one chunk slot of every sequence at once, with one frame per sequence.


class _VarlenPlan:
    """How a varlen batch is cut: sequence ``i`` (length ``n``) into the layout's ``m``
    chunks at ``c·n // m`` (sizes differ by at most one row; short sequences have empty
    chunks), each rank holding its chunks of every sequence, sequence by sequence."""

    def __init__(self, cu_seqlens, world, layout):
        self.world, self.layout = world, layout
        cu = [int(x) for x in torch.as_tensor(cu_seqlens).tolist()]
        if len(cu) < 2 or any(b < a for a, b in zip(cu, cu[1:])) or cu[0] != 0:
            raise ValueError(f"cu_seqlens must start at 0 and not decrease, found {cu}")
        self.starts = cu[:-1]
        self.lengths = [b - a for a, b in zip(cu, cu[1:])]
        m = _chunks_per_rank(layout) * world
        self.bounds = [[c * n // m for c in range(m + 1)] for n in self.lengths]

    def chunk(self, i, c):
        """Sequence ``i``'s chunk ``c``: (first row within the sequence, rows)."""
        b = self.bounds[i]
        return b[c], b[c + 1] - b[c]

    def chunks_of(self, rank):
        return _chunk_ids(self.layout, rank, self.world)

    def rows(self, rank):
        """Rows ``rank`` holds."""
        return sum(self.chunk(i, c)[1] for i in range(len(self.lengths)) for c in self.chunks_of(rank))

    def slot_rows(self, rank, slot):
        """Local rows of ``rank``'s chunk slot ``slot`` of every sequence, in sequence order."""
        out, base = [], 0
        for i in range(len(self.lengths)):
            for j, c in enumerate(self.chunks_of(rank)):
                n = self.chunk(i, c)[1]
                if j == slot:
                    out.append(torch.arange(base, base + n))
                base += n
        return torch.cat(out)

    def global_rows(self, rank):
        """Packed rows of the whole batch that ``rank`` holds, in its order."""
        return torch.cat([torch.arange(s + self.chunk(i, c)[0], s + sum(self.chunk(i, c)))
                          for i, s in enumerate(self.starts) for c in self.chunks_of(rank)])

    def cu(self, c):
        """``cu_seqlens`` of chunk ``c`` of every sequence (int32, on the CPU)."""
        sizes = [self.chunk(i, c)[1] for i in range(len(self.lengths))]
        return torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()], dtype=torch.int32)

    def frame(self, qid, kid):
        """The per-sequence frames of query chunk ``qid`` against key chunk ``kid``."""
        return torch.tensor([[self.chunk(i, qid)[0], self.chunk(i, kid)[0], n, n] for i, n in enumerate(self.lengths)],
                            dtype=torch.int32)


def shard_varlen(x, cu_seqlens, rank, world, layout="zigzag"):
    """This rank's rows of a packed varlen tensor (`[total, ...]`): its chunks of every
    sequence, sequence by sequence (any lengths: chunks differ by at most one row)."""
    return x[_VarlenPlan(cu_seqlens, world, layout).global_rows(rank).to(x.device)]


class _ContextParallelVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, attn, cfg, cu_seqlens, q, k, v, sinks, *aux):
        from .torch import SequencePositions

        group, strategy, layout, ints, floats, deterministic, int_params = cfg
        if strategy != "ring":
            raise NotImplementedError("varlen batches run with strategy='ring'")
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        plan = _VarlenPlan(cu_seqlens, world, layout)
        if q.shape[0] != plan.rows(rank):
            raise ValueError(f"this rank holds {plan.rows(rank)} rows of the batch by `cu_seqlens` (shard_varlen), "
                             f"found {q.shape[0]}")
        per = _chunks_per_rank(layout)
        mine = plan.chunks_of(rank)
        slots = [plan.slot_rows(rank, s).to(q.device) for s in range(per)]
        aux = list(aux)
        sink_spec = attn.spec["sinks"]

        def frame(qid, kid):
            return SequencePositions(plan.frame(qid, kid), sinks=kid == 0)

        def runs(qid, kid):
            if sink_spec and kid == 0:
                return True
            for i, n in enumerate(plan.lengths):
                (q0, qn), (k0, kn) = plan.chunk(i, qid), plan.chunk(i, kid)
                if qn and kn and attn._variant.classify_block(q0, q0 + qn, k0, k0 + kn, n, n, int_params) != "empty":
                    return True
            return False

        ring = _Ring(group, rank, world)
        o_acc = [torch.zeros(1, len(r), q.shape[1], v.shape[-1], device=q.device, dtype=torch.float32) for r in slots]
        lse_acc = [torch.full((1, q.shape[1], len(r)), float("-inf"), device=q.device, dtype=torch.float32)
                   for r in slots]
        q_slots = [q[rows].contiguous() for rows in slots]
        held_k, held_v = k.contiguous(), v.contiguous()
        last_stats.update(pairs=0, skipped=0)
        for step in range(world):
            owner = (rank - step) % world
            nxt = (rank - step - 1) % world
            pending = ring.shift([held_k, held_v], rows=plan.rows(nxt)) if step + 1 < world else None
            for j, kid in enumerate(plan.chunks_of(owner)):
                k_rows = plan.slot_rows(owner, j).to(q.device)
                kc, vc = held_k[k_rows].contiguous(), held_v[k_rows].contiguous()
                for i, qid in enumerate(mine):
                    last_stats["pairs"] += 1
                    if not runs(qid, kid):
                        last_stats["skipped"] += 1
                        continue
                    o_p, lse_p = _forward_impl(attn, q_slots[i], kc, vc, aux, sinks, plan.cu(qid), plan.cu(kid), None,
                                               None, ints, floats, 0, True, "", frame(qid, kid))
                    o_acc[i], lse_acc[i] = _merge(o_acc[i], lse_acc[i], o_p.unsqueeze(0), lse_p.unsqueeze(0))
            if pending is not None:
                for w in pending[0]:
                    w.wait()
                held_k, held_v = pending[1]
        o_slots = [x[0].to(q.dtype) for x in o_acc]
        lse_slots = [x[0].contiguous() for x in lse_acc]
        out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        for rows, o_s in zip(slots, o_slots):
            out[rows] = o_s
        ctx.save_for_backward(q, k, v, sinks, *o_slots, *lse_slots, *aux)
        ctx.attn, ctx.cfg, ctx.per, ctx.plan, ctx.slots = attn, cfg, per, plan, slots
        ctx.frame, ctx.runs = frame, runs
        return out

    @staticmethod
    def backward(ctx, d_o):
        attn, (group, strategy, layout, ints, floats, deterministic, int_params) = ctx.attn, ctx.cfg
        plan, slots, per = ctx.plan, ctx.slots, ctx.per
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        saved = ctx.saved_tensors
        q, k, v, sinks = saved[:4]
        o_slots, lse_slots, aux = saved[4:4 + per], saved[4 + per:4 + 2 * per], list(saved[4 + 2 * per:])
        mine = plan.chunks_of(rank)
        q_slots = [q[rows].contiguous() for rows in slots]
        do_slots = [d_o[rows].contiguous() for rows in slots]
        dq = torch.zeros_like(q, dtype=torch.float32)
        extra = _ExtraGrads(attn, sinks, len(aux))
        ring = _Ring(group, rank, world)
        held_k, held_v = k.contiguous(), v.contiguous()
        held_dk = torch.zeros_like(k, dtype=torch.float32)
        held_dv = torch.zeros_like(v, dtype=torch.float32)
        for step in range(world):
            owner = (rank - step) % world
            for j, kid in enumerate(plan.chunks_of(owner)):
                k_rows = plan.slot_rows(owner, j).to(q.device)
                kc, vc = held_k[k_rows].contiguous(), held_v[k_rows].contiguous()
                for i, qid in enumerate(mine):
                    if not ctx.runs(qid, kid):
                        continue
                    g = _backward_impl(attn.key, q_slots[i], kc, vc, o_slots[i], lse_slots[i], do_slots[i], aux,
                                       sinks, plan.cu(qid), plan.cu(kid), ints, floats, deterministic, "",
                                       ctx.frame(qid, kid))
                    dq[slots[i]] += g[0].float()
                    held_dk[k_rows] += g[1].float()
                    held_dv[k_rows] += g[2].float()
                    extra.add(g[3], g[4])
            last = step + 1 == world
            # What arrives: the next owner's chunks, or at the last step this rank's own dK/dV.
            nxt = (rank - step - 1) % world
            works, recv = ring.shift([held_dk, held_dv] if last else [held_k, held_v, held_dk, held_dv],
                                     rows=plan.rows(nxt))
            for w in works:
                w.wait()
            if last:
                held_dk, held_dv = recv
            else:
                held_k, held_v, held_dk, held_dv = recv
        return (None, None, None, dq.to(q.dtype), held_dk.to(k.dtype), held_dv.to(v.dtype),
                *extra.reduced(group))
