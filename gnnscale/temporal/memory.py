"""Node memory for memory-based temporal GNNs (TGN, Rossi et al. 2020), as an explicit state object.

Every node ``i`` has a memory vector ``s_i`` and the time ``t_i`` it was last updated.  An event
``(u, v, t, e)`` leaves a *message* for each endpoint, ``m_u = [s_u, s_v, e]`` at time ``t``
(and symmetrically for ``v``); the time encoding of ``t - t_u`` is added when the message is
applied, so the encoder is trained through it.  A node's pending messages are aggregated
(``last`` or ``mean`` of one batch's messages) and applied with a GRU cell.

Leakage-free order for one batch ``b`` (what :class:`TemporalMemory` is built for)::

    view = tm.updated(needed)          # 1. apply the messages of batches < b (differentiable)
    ... embeddings from `view`, loss, backward ...             # batch b's events not used yet
    tm.persist(nodes, view)            # 2. keep the updated rows of batch b's nodes (detached)
    tm.store_messages(src, dst, t, e)  # 3. batch b's events become messages for later batches

so a batch's own events never influence its own embeddings.  :class:`MemoryState` holds only
tensors (``state_dict``/``load_state_dict``, ``to(device)``, ``reset()``); the learnable parts
(time encoder, GRU) are ordinary ``nn.Module`` s.  Nothing here imports DGL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn


@dataclass(kw_only=True)
class MemoryConfig:
    """Sizes and policy of a :class:`TemporalMemory`."""

    memory_dim: int = 100
    """Width of each node's memory vector."""
    time_dim: int = 100
    """Width of the time encoding cos(w * dt + b)."""
    edge_dim: int = 0
    """Width of the per-event features carried in messages (0 when events have none)."""
    aggregator: Literal["last", "mean"] = "last"
    """How one batch's messages to the same node are combined."""

    def __post_init__(self) -> None:
        for name in ("memory_dim", "time_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.edge_dim < 0:
            raise ValueError(f"edge_dim must be >= 0, got {self.edge_dim}")
        if self.aggregator not in ("last", "mean"):
            raise ValueError(f"unknown aggregator {self.aggregator!r}; choose last or mean")

    @property
    def raw_message_dim(self) -> int:
        return 2 * self.memory_dim + self.edge_dim


class TimeEncoder(nn.Module):
    """``phi(dt) = cos(w * dt + b)``, ``w`` initialised to ``10 ** -linspace(0, 9, dim)`` as in TGN."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(1, dim)
        with torch.no_grad():
            self.linear.weight.copy_((1.0 / 10 ** torch.linspace(0, 9, dim)).unsqueeze(1))
            self.linear.bias.zero_()

    def forward(self, dt: Tensor) -> Tensor:
        """``dt`` float [...] -> float [..., dim]."""
        return torch.cos(self.linear(dt.unsqueeze(-1).to(self.linear.weight.dtype)))


class MemoryState:
    """The non-learnable state: memory, last-update times and one pending (aggregated) message per node.

    Rows are *slots*: ``slot[node]`` is the row holding ``node`` (-1: not held here), ``node[row]``
    the node a row holds (-1: free).  The default table is dense, a row per node (``slot`` is the
    identity); a table of ``capacity`` rows holds only the nodes admitted with :meth:`admit` (the
    sharded memory's owned nodes and its bounded cache), which :meth:`evict` lets go again.

    Attributes (all tensors on one device, one row per slot):
        memory: float [rows, memory_dim].
        last_update: float64 [rows] time of each node's last memory update (0 at start).
        mail: float [rows, raw_message_dim] pending aggregated message ``[s_self, s_other, e]``.
        mail_time: float64 [rows] time of the pending message.
        has_mail: bool [rows].
    """

    def __init__(self, num_nodes: int, config: MemoryConfig, device: torch.device | str = "cpu",
                 capacity: int | None = None) -> None:
        if capacity is not None and not 0 <= capacity:
            raise ValueError(f"capacity must be >= 0 rows, got {capacity}")
        self.num_nodes, self.config = num_nodes, config
        self.dense = capacity is None
        self.capacity = num_nodes if capacity is None else capacity
        self.device = torch.device(device)
        self.dtype = torch.float32
        self.reset()

    def reset(self) -> None:
        """Forget everything: zero memory, times and mail (start of every epoch over the stream); a
        bounded table keeps which nodes it holds."""
        rows, cfg, device = self.capacity, self.config, self.device
        self.memory = torch.zeros(rows, cfg.memory_dim, dtype=self.dtype, device=device)
        self.last_update = torch.zeros(rows, dtype=torch.float64, device=device)
        self.mail = torch.zeros(rows, cfg.raw_message_dim, dtype=self.dtype, device=device)
        self.mail_time = torch.zeros(rows, dtype=torch.float64, device=device)
        self.has_mail = torch.zeros(rows, dtype=torch.bool, device=device)
        if self.dense:
            self.slot = self.node = torch.arange(self.num_nodes, device=device)
        elif not hasattr(self, "slot"):
            self.slot = torch.full((self.num_nodes,), -1, dtype=torch.int64, device=device)
            self.node = torch.full((rows,), -1, dtype=torch.int64, device=device)

    _FIELDS = ("memory", "last_update", "mail", "mail_time", "has_mail")
    _MAPS = ("slot", "node")

    @property
    def rows_held(self) -> int:
        return self.num_nodes if self.dense else int((self.node >= 0).sum())

    def rows(self, nodes: Tensor) -> Tensor:
        """The rows holding ``nodes`` (every one must be held)."""
        return nodes if self.dense else self.slot[nodes]

    def admit(self, nodes: Tensor) -> Tensor:
        """Give the distinct, not yet held ``nodes`` free rows (zeroed: a node never written), growing
        the table when it is full; returns their rows."""
        assert not self.dense
        free = torch.nonzero(self.node < 0).squeeze(1)
        if free.numel() < nodes.numel():
            self._grow(self.capacity + nodes.numel() - free.numel())
            free = torch.nonzero(self.node < 0).squeeze(1)
        rows = free[:nodes.numel()]
        self.slot[nodes], self.node[rows] = rows, nodes
        self._clear(rows)
        return rows

    def evict(self, nodes: Tensor) -> None:
        """Stop holding ``nodes`` (held, distinct); their rows become free."""
        assert not self.dense
        rows = self.slot[nodes]
        self.node[rows] = -1
        self.slot[nodes] = -1
        self._clear(rows)

    def _clear(self, rows: Tensor) -> None:
        for name in self._FIELDS:
            getattr(self, name)[rows] = 0

    def _grow(self, capacity: int) -> None:
        extra = capacity - self.capacity
        for name in self._FIELDS:
            value = getattr(self, name)
            setattr(self, name, torch.cat([value, value.new_zeros((extra, *value.shape[1:]))]))
        self.node = torch.cat([self.node, self.node.new_full((extra,), -1)])
        self.capacity = capacity

    def state_dict(self, copy: bool = True) -> dict[str, Tensor]:
        """Every tensor of the state; ``copy=False`` gives the live tensors (to be written out at once,
        without a second table in memory)."""
        names = self._FIELDS if self.dense else self._FIELDS + self._MAPS
        return {name: getattr(self, name).clone() if copy else getattr(self, name) for name in names}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if not self.dense:  # a bounded table may have grown since: take its size from the state
            self.capacity = state["node"].shape[0]
            self.node = self.node.new_empty(self.capacity)
            for name in self._FIELDS:
                current = getattr(self, name)
                setattr(self, name, current.new_empty((self.capacity, *current.shape[1:])))
        for name in self._FIELDS + (() if self.dense else self._MAPS):
            value = state[name]
            current = getattr(self, name)
            if value.shape != current.shape or value.dtype != current.dtype:
                raise ValueError(f"memory state {name!r} has shape {tuple(value.shape)} and dtype {value.dtype}, "
                                 f"expected {tuple(current.shape)} and {current.dtype} (a different graph or config?)")
            setattr(self, name, value.to(self.device).clone())

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> "MemoryState":
        """Move every tensor to ``device``; ``dtype`` also casts the float ones (memory, mail)."""
        self.device = torch.device(device)
        self.dtype = self.dtype if dtype is None else dtype
        for name in self._FIELDS + self._MAPS:
            value = getattr(self, name).to(self.device)
            if dtype is not None and name in ("memory", "mail"):
                value = value.to(dtype)
            setattr(self, name, value)
        return self


@dataclass
class MemoryView:
    """The memory of the distinct, sorted ``nodes`` a step reads, pending messages applied
    (:meth:`TemporalMemory.updated`): ``memory`` float [U, d] and ``last_update`` float64 [U]."""

    nodes: Tensor
    memory: Tensor
    last_update: Tensor

    def index(self, ids: Tensor) -> Tensor:
        """Positions of ``ids`` among :attr:`nodes` (ids outside them, such as padding, get some row)."""
        return torch.searchsorted(self.nodes, ids).clamp(max=max(self.nodes.numel() - 1, 0))

    def rows(self, ids: Tensor) -> Tensor:
        # index_select, not [index]: the memory needs grad, and index_select's backward is deterministic.
        return self.memory.index_select(0, self.index(ids))

    def detach(self) -> "MemoryView":
        return MemoryView(self.nodes, self.memory.detach(), self.last_update)


class TemporalMemory(nn.Module):
    """Learnable memory updater (time encoder + GRU cell) around the :class:`MemoryState` of ``num_nodes`` nodes."""

    def __init__(self, num_nodes: int, config: MemoryConfig) -> None:
        super().__init__()
        self.config = config
        self.time_encoder = TimeEncoder(config.time_dim)
        self.gru = nn.GRUCell(config.raw_message_dim + config.time_dim, config.memory_dim)
        self.state = MemoryState(num_nodes, config)

    def _apply(self, fn, *args, **kwargs):  # the state follows the module through .to()/.cuda()/.double()
        result = super()._apply(fn, *args, **kwargs)
        self.state.to(self.gru.weight_hh.device, self.gru.weight_hh.dtype)
        return result

    def updated(self, needed: Tensor) -> MemoryView:
        """The memory of the ``needed`` nodes (all held) after applying their pending messages.

        Differentiable in the GRU and the time encoder; the stored state is not changed.  A batch
        needs only its own nodes and their sampled neighbours, and updating and copying just those
        keeps a step's cost independent of the number of nodes.
        """
        state = self.state
        nodes = torch.unique(needed)
        rows = state.rows(nodes)
        memory, last_update = state.memory[rows], state.last_update[rows]
        pending = torch.nonzero(state.has_mail[rows]).squeeze(1)
        if pending.numel():
            mailed = rows[pending]
            dt = (state.mail_time[mailed] - state.last_update[mailed]).to(state.memory.dtype)
            message = torch.cat([state.mail[mailed], self.time_encoder(dt)], dim=1)
            memory = memory.index_put((pending,), self.gru(message, state.memory[mailed]))
            last_update = last_update.index_put((pending,), state.mail_time[mailed])
        return MemoryView(nodes, memory, last_update)

    @torch.no_grad()
    def persist(self, nodes: Tensor, view: MemoryView) -> None:
        """Keep the updated rows of ``nodes`` (from :meth:`updated`) and clear their mail."""
        nodes = torch.unique(nodes)
        self.set_rows(nodes, view.rows(nodes).detach(), view.last_update[view.index(nodes)])

    @torch.no_grad()
    def set_rows(self, nodes: Tensor, memory: Tensor, last_update: Tensor) -> None:
        """Store updated ``memory`` and ``last_update`` for the distinct ``nodes``, their mail consumed."""
        state = self.state
        rows = state.rows(nodes)
        state.memory[rows] = memory.to(state.memory.dtype)
        state.last_update[rows] = last_update
        state.has_mail[rows] = False

    @torch.no_grad()
    def store_messages(self, src: Tensor, dst: Tensor, t: Tensor, edge_features: Tensor | None = None) -> None:
        """Turn events ``src -> dst`` at ``t`` (float64 [B]) into pending messages for both endpoints.

        Messages carry the endpoints' *stored* memory (call after :meth:`persist`).  A node with
        several events in the batch keeps the last one's message (``last``) or their mean (``mean``),
        at the time of its last event.
        """
        state = self.state
        ends = torch.unique(torch.cat([src, dst]))
        stored = MemoryView(ends, state.memory[state.rows(ends)], state.last_update[state.rows(ends)])
        nodes, times, messages = self.make_messages(src, dst, t, stored, edge_features)
        self.deliver(nodes, times, torch.arange(nodes.numel(), device=nodes.device), messages)

    @torch.no_grad()
    def make_messages(self, src: Tensor, dst: Tensor, t: Tensor, view: MemoryView,
                      edge_features: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """The raw messages of events ``src -> dst`` at ``t``, read from ``view``:
        ``(nodes [2B], times float64 [2B], messages [2B, raw_message_dim])``, first every
        source's message ``[s_src, s_dst, e]``, then every destination's ``[s_dst, s_src, e]``."""
        s_src, s_dst = view.rows(src), view.rows(dst)
        parts_src, parts_dst = [s_src, s_dst], [s_dst, s_src]
        if self.config.edge_dim:
            if edge_features is None:
                raise ValueError(f"the memory expects {self.config.edge_dim} edge features per event, got none")
            parts_src.append(edge_features.to(s_src.dtype))
            parts_dst.append(edge_features.to(s_src.dtype))
        nodes = torch.cat([src, dst])
        messages = torch.cat([torch.cat(parts_src, 1), torch.cat(parts_dst, 1)]).detach()
        return nodes, torch.cat([t, t]).to(torch.float64), messages

    @torch.no_grad()
    def deliver(self, nodes: Tensor, times: Tensor, keys: Tensor, messages: Tensor) -> None:
        """Aggregate one batch's messages per node into its mailbox (every node held).

        ``last`` keeps each node's message with the largest ``(time, key)``; ``mean`` averages them.
        ``keys`` (int64, distinct) order messages of equal time: :meth:`store_messages` passes
        positions in ``[sources; destinations]``, the sharded memory the same positions in the
        global batch, so that every rank picks the message a single process would.
        """
        state, cfg = self.state, self.config
        order = torch.argsort(keys)
        order = order[torch.argsort(times[order], stable=True)]  # by (time, key)
        nodes, messages, times = nodes[order], messages[order], times[order]
        unique, inverse, last = last_occurrence(nodes)
        if cfg.aggregator == "last":
            aggregated = messages[last]
        else:
            total = messages.new_zeros(unique.numel(), messages.shape[1]).index_add_(0, inverse, messages)
            count = torch.bincount(inverse, minlength=unique.numel()).clamp(min=1).to(messages.dtype)
            aggregated = total / count.unsqueeze(1)
        rows = state.rows(unique)
        state.mail[rows] = aggregated.to(state.mail.dtype)
        state.mail_time[rows] = times[last]
        state.has_mail[rows] = True


def last_occurrence(values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Distinct ``values``, the index of each value among them (``inverse``) and each one's last position."""
    unique, inverse = torch.unique(values, return_inverse=True)
    last = torch.full((unique.numel(),), -1, dtype=torch.int64, device=values.device)
    last.scatter_reduce_(0, inverse, torch.arange(values.numel(), device=values.device), reduce="amax")
    return unique, inverse, last
