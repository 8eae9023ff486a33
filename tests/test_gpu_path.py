"""The device path (layers, batches, trainer module) must work without DGL and on CUDA."""

import subprocess
import sys

import pytest
import torch

from gnnscale.batch import Block, MiniBatch
from gnnscale.nn import GNN, ModelConfig

NO_DGL = """
import sys
sys.modules["dgl"] = None  # any `import dgl` now raises ImportError
import torch
from gnnscale.batch import MiniBatch
from gnnscale.nn import GNN, ModelConfig
import gnnscale.train.trainer  # the whole training path imports without DGL
batch = MiniBatch.load(sys.argv[1])
for name in ("sage", "gcn", "gat"):
    model = GNN(ModelConfig(model=name, num_layers=2, hidden=4, heads=2), 3, 2)
    out = model(batch.blocks, torch.ones(batch.input_ids.numel(), 3))
    assert out.shape == (batch.seeds.numel(), 2), out.shape
print("ok")
"""


def tiny_batch() -> MiniBatch:
    outer = Block(indptr=torch.tensor([0, 2, 3, 4]), indices=torch.tensor([1, 3, 0, 2]),
                  src_ids=torch.tensor([5, 6, 7, 8]), num_dst=3, edge_weight=torch.tensor([0.5, 0.5, 1.0, 1.0]))
    inner = Block(indptr=torch.tensor([0, 1, 3]), indices=torch.tensor([2, 0, 1]),
                  src_ids=torch.tensor([5, 6, 7]), num_dst=2, edge_weight=torch.tensor([1.0, 0.5, 0.5]))
    return MiniBatch(seeds=torch.tensor([5, 6]), blocks=[outer, inner])


def test_layers_run_on_saved_batches_without_dgl(tmp_path):
    tiny_batch().save(tmp_path / "batch.pt")
    run = subprocess.run([sys.executable, "-c", NO_DGL, str(tmp_path / "batch.pt")], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("name", ["sage", "gcn", "gat"])
def test_layers_match_between_cpu_and_cuda(name):
    torch.manual_seed(0)
    model = GNN(ModelConfig(model=name, num_layers=2, hidden=4, heads=2), 3, 2).eval()
    batch, x = tiny_batch(), torch.randn(4, 3)
    expected = model(batch.blocks, x)
    got = model.to("cuda")(batch.to("cuda").blocks, x.cuda())
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)
