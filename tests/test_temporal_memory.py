"""The memory-state module: message storage, aggregation, update order, state handling."""

from __future__ import annotations

import pytest
import torch

from gnnscale.temporal import MemoryConfig, MemoryState, TemporalMemory


def memory(aggregator: str = "last", edge_dim: int = 2, num_nodes: int = 6) -> TemporalMemory:
    torch.manual_seed(0)
    return TemporalMemory(num_nodes, MemoryConfig(memory_dim=4, time_dim=3, edge_dim=edge_dim, aggregator=aggregator))


def t64(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_messages_go_to_both_endpoints_with_the_latest_time():
    tm = memory()
    tm.state.memory = torch.arange(24, dtype=torch.float32).view(6, 4)
    features = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    tm.store_messages(torch.tensor([0, 0]), torch.tensor([1, 2]), t64(5.0, 7.0), features)
    state = tm.state
    assert state.has_mail.tolist() == [True, True, True, False, False, False]
    assert state.mail_time[:3].tolist() == [7.0, 5.0, 7.0]
    # node 0's last event is 0 -> 2 at t=7: [s_0, s_2, e_1]
    torch.testing.assert_close(state.mail[0], torch.cat([state.memory[0], state.memory[2], features[1]]))
    # node 1 receives [s_1, s_0, e_0]
    torch.testing.assert_close(state.mail[1], torch.cat([state.memory[1], state.memory[0], features[0]]))


def test_mean_aggregator_averages_one_batch_of_messages():
    tm = memory("mean")
    tm.state.memory = torch.randn(6, 4)
    features = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    tm.store_messages(torch.tensor([0, 0]), torch.tensor([1, 2]), t64(5.0, 7.0), features)
    expected = (torch.cat([tm.state.memory[0], tm.state.memory[1], features[0]]) +
                torch.cat([tm.state.memory[0], tm.state.memory[2], features[1]])) / 2
    torch.testing.assert_close(tm.state.mail[0], expected)
    assert tm.state.mail_time[0] == 7.0


def test_updated_leaves_the_state_alone_and_persist_consumes_the_mail():
    tm = memory()
    tm.store_messages(torch.tensor([0]), torch.tensor([1]), t64(3.0), torch.ones(1, 2))
    before = tm.state.state_dict()
    view = tm.updated(torch.tensor([3, 1, 0, 1]))
    for name, value in tm.state.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert view.nodes.tolist() == [0, 1, 3]  # only the needed nodes, distinct and sorted
    assert view.memory.requires_grad  # trained through the GRU
    assert not torch.equal(view.rows(torch.tensor([0]))[0], before["memory"][0])
    assert torch.equal(view.rows(torch.tensor([3]))[0], before["memory"][3])
    assert view.last_update.tolist() == [3.0, 3.0, 0.0]
    # A node's updated row does not depend on which other nodes are needed.
    partial = tm.updated(torch.tensor([1, 4]))
    assert torch.equal(partial.rows(torch.tensor([1])), view.rows(torch.tensor([1])))
    tm.persist(torch.tensor([0]), view)
    assert tm.state.has_mail.tolist()[:2] == [False, True]
    assert torch.equal(tm.state.memory[0], view.rows(torch.tensor([0]))[0].detach())
    assert not tm.state.memory.requires_grad
    assert tm.state.last_update[0] == 3.0


def test_a_bounded_table_holds_admitted_nodes_and_grows_when_full():
    state = MemoryState(10, MemoryConfig(memory_dim=2, time_dim=2), capacity=3)
    assert state.rows_held == 0 and state.memory.shape == (3, 2)
    rows = state.admit(torch.tensor([7, 2]))
    state.memory[rows] = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    assert state.rows(torch.tensor([2, 7])).tolist() == rows.flip(0).tolist()
    state.evict(torch.tensor([7]))
    assert state.slot[7] == -1 and state.rows_held == 1
    state.admit(torch.tensor([1, 3, 4]))  # 2 free rows, 3 nodes: grows to 4 rows
    assert state.capacity == 4 and state.rows_held == 4
    assert state.memory[state.rows(torch.tensor([1, 3, 4]))].abs().sum() == 0  # admitted rows start at zero
    assert torch.equal(state.memory[state.rows(torch.tensor([2]))], torch.tensor([[2.0, 2.0]]))
    saved = state.state_dict()
    other = MemoryState(10, state.config, capacity=3)
    other.load_state_dict(saved)  # takes the grown size
    assert other.capacity == 4 and torch.equal(other.slot, state.slot)
    with pytest.raises(ValueError, match="capacity must be >= 0 rows, got -1"):
        MemoryState(10, state.config, capacity=-1)


def test_reset_state_dict_and_device_round_trip():
    tm = memory()
    tm.store_messages(torch.tensor([0]), torch.tensor([1]), t64(3.0), torch.ones(1, 2))
    saved = tm.state.state_dict()
    tm.state.reset()
    assert not tm.state.has_mail.any() and not tm.state.memory.any()
    tm.state.load_state_dict(saved)
    assert tm.state.has_mail[:2].all()
    tm.to("cpu")
    assert tm.state.memory.device.type == "cpu"
    other = MemoryState(7, tm.config)
    with pytest.raises(ValueError, match="memory state 'memory' has shape \\(6, 4\\).*expected \\(7, 4\\)"):
        other.load_state_dict(saved)


def test_config_and_missing_edge_feature_errors():
    with pytest.raises(ValueError, match="unknown aggregator 'max'"):
        MemoryConfig(aggregator="max")
    with pytest.raises(ValueError, match="memory_dim must be >= 1"):
        MemoryConfig(memory_dim=0)
    with pytest.raises(ValueError, match="expects 2 edge features per event, got none"):
        memory().store_messages(torch.tensor([0]), torch.tensor([1]), t64(1.0))
