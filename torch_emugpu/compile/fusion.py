"""Which ops of an AOTAutograd graph Inductor would fuse into one kernel.

Inductor turns a graph's pointwise ops and reductions into generated
kernels: a chain of pointwise ops is one kernel, pointwise ops feeding a
reduction are its prologue, and pointwise ops over the same rows after it
(softmax's subtract and exp, layer norm's scale and shift) its epilogue. What
it leaves as library calls (matmuls, convolutions, attention, gathers,
scatters, concatenations, anything that mutates) runs as its own kernel.

This module groups a graph's nodes the same way, by the rules Inductor's
scheduler fuses by (`can_fuse`: one iteration space, a reduction's rows
matching), greedily in graph order and never into a cycle. Each group is then
charged as one kernel moving the bytes of its external inputs and of the
values read outside it (runner.py); values that stay inside a group are
never written to memory.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

aten = torch.ops.aten

# Inductor's threshold for a persistent reduction (a row kept in registers, read once): beyond it the
# generated kernel loops over the row once per reduction it computes, and once more for its epilogue.
PERSISTENT_ROW = 1024

# Ops whose output is a view or metadata change of their input: free, as in Inductor.
_VIEW_LIKE = {aten._unsafe_view.default, aten.reshape.default, aten.lift_fresh.default}
# Ops Inductor generates as pointwise kernels although PyTorch does not tag them pointwise.
_EXTRA_POINTWISE = {
    aten._to_copy.default,
    aten.full.default,
    aten.full_like.default,
    aten.zeros.default,
    aten.ones.default,
    aten.zeros_like.default,
    aten.ones_like.default,
    aten.scalar_tensor.default,
    aten.rand.default,
    aten.randn.default,
    aten.rand_like.default,
    aten.randn_like.default,
    aten.bernoulli.default,
    aten.bernoulli.p,
    aten.native_dropout.default,
    aten.arange.start_step,
    aten.arange.start,
    aten.arange.default,
    aten.lift_fresh_copy.default,
    aten.copy.default,
    aten.clamp.default,
    aten.clamp.Tensor,
    aten.floor_divide.default,
}
# Inductor's own prims (registered when Inductor is imported), by name: max pooling's backward turns the
# forward's window offsets into indices in a pointwise kernel.
_EXTRA_POINTWISE_NAMES = {"prims._low_memory_max_pool_offsets_to_indices.default"}


def _meta(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _tensors(value: Any) -> list[Any]:
    return [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def _numel(value: Any) -> int:
    tensors = _tensors(value)
    return int(tensors[0].numel()) if tensors else 1


def tensor_bytes(value: Any) -> int:
    return sum(int(t.numel()) * t.element_size() for t in _tensors(value))


def has_symbolic_shapes(graph: torch.fx.Graph) -> bool:
    """Whether any value's sizes or strides are symbolic (a dynamic-shape graph)."""
    for node in graph.nodes:
        for v in pytree.tree_leaves(node.meta.get("val")):
            if isinstance(v, torch.SymInt | torch.SymFloat):
                return True
            if isinstance(v, torch.Tensor) and any(
                isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride(), v.storage_offset())
            ):
                return True
    return False


def is_view(node: torch.fx.Node) -> bool:
    target = node.target
    return node.op == "call_function" and (
        target in _VIEW_LIKE or (isinstance(target, torch._ops.OpOverload) and target.is_view)
    )


def kind(node: torch.fx.Node) -> str:
    """ "pointwise", "reduction", "view", "getitem" or "extern" (a kernel of its own, run as eager)."""
    if node.op != "call_function":
        return "extern"
    target = node.target
    if target is operator.getitem:
        return "getitem"
    if is_view(node):
        return "view"
    if not isinstance(target, torch._ops.OpOverload) or target._schema.is_mutable:
        return "extern"
    out = _tensors(_meta(node))
    # Only kernels on emugpu that stay on it: a copy to or from the host is a transfer, not a kernel.
    if not out or any(t.device.type != "emugpu" for t in out):
        return "extern"
    if any(t.device.type != "emugpu" and t.dim() > 0 for t in _tensors([_meta(a) for a in node.all_input_nodes])):
        return "extern"
    if torch.Tag.reduction in target.tags:
        return "reduction"
    if torch.Tag.pointwise in target.tags or target in _EXTRA_POINTWISE or str(target) in _EXTRA_POINTWISE_NAMES:
        return "pointwise"
    return "extern"


@dataclass
class Group:
    """One generated kernel: its member nodes, its iteration space and what it reads and writes."""

    index: int
    total: int  # elements it iterates over: a pointwise numel, or a reduction's rows x row length
    row: int = 1  # a reduction's row length (1: pointwise only)
    nodes: list[torch.fx.Node] = field(default_factory=list)
    reductions: int = 0
    epilogue: bool = False  # a full-size pointwise op after a reduction (one more pass over a long row)
    inputs: dict[torch.fx.Node, int] = field(default_factory=dict)  # external value -> bytes read
    outputs: dict[torch.fx.Node, int] = field(default_factory=dict)  # member read outside -> bytes written

    def bytes(self) -> int:
        passes = 1
        if self.row > PERSISTENT_ROW:
            passes = max(1, self.reductions + (1 if self.epilogue else 0))
        read = sum(b * (passes if b >= self.total else 1) for b in self.inputs.values())
        return read + sum(self.outputs.values())


@dataclass
class Plan:
    """The grouping of one graph."""

    kinds: dict[torch.fx.Node, str]
    group_of: dict[torch.fx.Node, int]
    groups: list[Group]
    inline: set[torch.fx.Node]  # inputless pointwise ops (fills, scalars, random): generated inside their readers
    needed: set[torch.fx.Node]  # values that must exist as device tensors (read by another kernel or returned)
    last_member: dict[torch.fx.Node, int]  # node -> the group that is complete once it ran


def base_of(node: Any, kinds: dict[torch.fx.Node, str]) -> Any:
    """The value a view chain starts from."""
    while isinstance(node, torch.fx.Node) and kinds.get(node) == "view":
        node = node.args[0]
    return node


def plan(graph: torch.fx.Graph) -> Plan:
    nodes = list(graph.nodes)
    kinds = {n: kind(n) if n.op == "call_function" else n.op for n in nodes}
    # A getitem of a fused multi-output op (var_mean, max.dim, native_dropout) is part of that op.
    for n in nodes:
        if kinds[n] == "getitem" and kinds.get(n.args[0]) in ("pointwise", "reduction"):
            kinds[n] = "member"
    fused = ("pointwise", "reduction", "member")
    inline = {n for n in nodes if kinds[n] == "pointwise" and not _tensor_inputs(n, kinds)}
    group_of: dict[torch.fx.Node, int] = {}
    groups: list[Group] = []
    ancestors: dict[torch.fx.Node, int] = {}  # node -> bit set of the groups its value depends on
    parent: list[int] = []  # union-find over merged groups
    position = {n: k for k, n in enumerate(nodes)}

    def find(g: int) -> int:
        while parent[g] != g:
            parent[g] = parent[parent[g]]
            g = parent[g]
        return g

    def find_group(node: Any) -> int | None:
        return find(group_of[node]) if node in group_of else None

    def _between(a: int, b: int) -> bool:
        """Whether a kernel outside groups a and b reads one and feeds the other (merging them: a cycle)."""
        for x, y in ((a, b), (b, a)):
            for member in groups[y].nodes:
                for i in member.all_input_nodes:
                    j = base_of(i, kinds)
                    if find_group(j) not in (a, b) and ancestors.get(j, 0) >> x & 1:
                        return True
        return False

    def merge(into: int, other: int) -> None:
        target, source_group = groups[into], groups[other]
        target.nodes.extend(source_group.nodes)
        target.reductions += source_group.reductions
        target.epilogue = target.epilogue or source_group.epilogue
        target.row = max(target.row, source_group.row)
        target.total = max(target.total, source_group.total)
        source_group.nodes = []
        parent[other] = into
        for node, bits in ancestors.items():
            if bits >> other & 1:
                ancestors[node] = bits | (1 << into)

    for n in nodes:
        inputs = [base_of(i, kinds) for i in n.all_input_nodes]
        depends = 0
        for i in inputs:
            depends |= ancestors.get(i, 0)
        if kinds[n] not in fused or n in inline:
            ancestors[n] = depends
            continue
        if kinds[n] == "member":
            owner = find(group_of[n.args[0]])
            group_of[n] = owner
            groups[owner].nodes.append(n)
            ancestors[n] = depends | (1 << owner)
            continue
        reduction = kinds[n] == "reduction"
        numel = _numel(_meta(n))
        source = _numel(_meta(n.args[0])) if reduction and n.args else numel
        candidates: list[int] = []
        for i in inputs:
            g = find_group(i)
            if g is None or g in candidates or not _fits(groups[g], reduction, numel, source):
                continue
            # Fusing must not close a cycle: another input must not depend on this group through a kernel outside it.
            if any(find_group(j) != g and ancestors.get(j, 0) >> g & 1 for j in inputs):
                continue
            candidates.append(g)
        if candidates:
            chosen = candidates[0]
            # Inductor fuses every producer kernel this op reads (vertical fusion), where no cycle results.
            for other in candidates[1:]:
                if _fits_group(groups[chosen], groups[other]) and not _between(chosen, other):
                    merge(chosen, other)
        else:
            chosen = len(groups)
            groups.append(Group(chosen, total=source if reduction else numel))
            parent.append(chosen)
        group = groups[chosen]
        if reduction:
            if group.row == 1:
                group.row = max(1, source // max(numel, 1))
            group.reductions += 1
        elif group.row > 1 and numel == group.total:
            group.epilogue = True
        group.nodes.append(n)
        group_of[n] = chosen
        ancestors[n] = depends | (1 << chosen)

    for n in nodes:
        if n in group_of:
            group_of[n] = find(group_of[n])
    # An input mutation (BatchNorm's running statistics: copy_ into a graph input) of a fused value is a
    # store of the kernel that computes it, not a copy kernel of its own.
    for n in nodes:
        if n.op == "call_function" and n.target is aten.copy_.default and len(n.args) >= 2:
            dst, src = n.args[0], base_of(n.args[1], kinds)
            if isinstance(dst, torch.fx.Node) and dst.op == "placeholder" and src in group_of:
                kinds[n] = "store"
                group_of[n] = group_of[src]
                groups[group_of[n]].nodes.append(n)
    groups = [kept for kept in groups if kept.nodes and find(kept.index) == kept.index]
    renumber = {kept.index: k for k, kept in enumerate(groups)}
    for k, kept in enumerate(groups):
        kept.index = k
        kept.nodes.sort(key=position.__getitem__)
    for n in list(group_of):
        group_of[n] = renumber[group_of[n]]

    needed = _needed(nodes, kinds, group_of, inline)
    # Pointwise values another kernel reads but no library call or output does are computed again inside
    # that kernel (Inductor inlines pointwise ops into each reader): it reads their inputs instead.
    absorbs: list[set[int]] = [set() for _ in groups]
    for n in nodes:
        if n not in group_of:
            continue
        g = group_of[n]
        group = groups[g]
        if n in needed or kinds[n] == "store":
            group.outputs[n] = tensor_bytes(_meta(n))
        if kinds[n] == "store":
            continue  # it writes its destination, and reads what its group computed
        for i in n.all_input_nodes:
            b = base_of(i, kinds)
            if group_of.get(b) == g or b in inline:
                continue
            if b in group_of and b not in needed:
                absorbs[g].add(group_of[b])
                continue
            read = tensor_bytes(_meta(b))
            if i is not b:  # a view of it: what the view selects, never more than the value holds
                read = min(read, tensor_bytes(_meta(i)))
            group.inputs[b] = max(group.inputs.get(b, 0), read)
    direct = [dict(g.inputs) for g in groups]
    for g, others in enumerate(absorbs):
        for o in others:
            for b, read in direct[o].items():
                groups[g].inputs[b] = max(groups[g].inputs.get(b, 0), read)
    last_member = {group.nodes[-1]: group.index for group in groups}
    return Plan(kinds, group_of, groups, inline, needed, last_member)


def _tensor_inputs(node: torch.fx.Node, kinds: dict[torch.fx.Node, str]) -> list[torch.fx.Node]:
    return [i for i in node.all_input_nodes if _tensors(_meta(i))]


def _fits(group: Group, reduction: bool, numel: int, source: int) -> bool:
    """Whether an op joins `group` as Inductor's scheduler would: one iteration space, rows matching."""
    if reduction:
        row = max(1, source // max(numel, 1))
        return source == group.total and (group.row == 1 or group.row == row)
    return numel == group.total or (group.row > 1 and numel * group.row == group.total)


def _fits_group(a: Group, b: Group) -> bool:
    """Whether two kernels share one iteration space (a reduction's rows matching), so they fuse."""
    if a.total != b.total and not (a.row > 1 and b.row == 1 and b.total * a.row == a.total):
        return b.row > 1 and a.row == 1 and a.total * b.row == b.total
    return a.row == 1 or b.row == 1 or a.row == b.row


def _needed(
    nodes: list[torch.fx.Node], kinds: dict[torch.fx.Node, str], group_of: dict[torch.fx.Node, int], inline: set[Any]
) -> set[torch.fx.Node]:
    """The fused values some other kernel reads, or the graph returns: they are written to device memory."""
    needed: set[torch.fx.Node] = set()
    for n in reversed(nodes):
        if n.op == "output":
            readers: list[Any] = [(None, i) for i in n.all_input_nodes]
        else:
            readers = []
        for user in n.users:
            readers.append((user, n))
        for user, value in readers:
            if user is None or kinds.get(user) not in ("pointwise", "reduction", "member", "view", "store"):
                needed.add(value)
            elif kinds[user] == "view":
                if user in needed:
                    needed.add(value)
            elif value in inline:
                continue  # a fill or scalar that a kernel reads is generated inside it
            elif group_of.get(user) != group_of.get(value) and kinds.get(value) != "pointwise":
                needed.add(value)  # a reduction's result is always written; pointwise ops are inlined
    # A view read outside needs the value it views to exist.
    for n in reversed(nodes):
        if n in needed and kinds.get(n) == "view":
            needed.add(n.args[0])  # type: ignore[arg-type]
    return needed
