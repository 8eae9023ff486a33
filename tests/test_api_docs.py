"""docs/api.md stays true: its python blocks run, in order, in one namespace (a world of one); and the examples
run unchanged with python and with torchrun on 2 ranks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_api_page_snippets_run(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = python_blocks(ROOT / "docs" / "api.md")
    assert len(blocks) >= 5, "docs/api.md lost its examples"
    namespace: dict = {"__name__": "api_docs"}
    for number, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/api.md block {number}", "exec"), namespace)  # noqa: S102 - our own docs
        except Exception as error:  # noqa: BLE001 - name the block that broke
            raise AssertionError(f"docs/api.md python block {number} failed: {error!r}\n{block}") from error
    printed = capsys.readouterr().out
    assert "fanout 0 is invalid" in printed and "validation accuracy" in printed and "temporal: test AP" in printed


def test_library_calls_leave_the_global_generator_and_configs_alone() -> None:
    import copy

    import gnnscale as gs
    from gnnscale.train.trainer import TrainConfig
    from samplers import SamplerConfig

    dataset = gs.load_dataset("synthetic", None, num_nodes=600, num_classes=3, feat_dim=8, seed=1)
    config = TrainConfig(epochs=2, batch_size=128, features_on_device=True)  # ignored on CPU, with a warning
    sampler = SamplerConfig(fanouts=[4, 4])
    given = (copy.deepcopy(config), copy.deepcopy(sampler))
    state = torch.random.get_rng_state()
    with gs.init() as world:
        graph = gs.Graph.from_dataset(dataset, world)
        loader = gs.NodeLoader(graph, graph.train_ids, fanouts=[4, 4], batch_size=128)
        sum(batch.x.shape[0] for batch in loader)
        trainer = gs.Trainer(graph, model_config=gs.ModelConfig(num_layers=2, hidden=8), sampler_config=sampler,
                             config=config)
        trainer.fit()
        gs.layerwise_inference(graph, trainer.model)
    assert torch.equal(torch.random.get_rng_state(), state)  # the trainer forks the generator for dropout
    assert (config, sampler) == given


def test_public_names_are_exported() -> None:
    import gnnscale as gs

    for name in gs.__all__:
        assert getattr(gs, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        gs.Nope  # noqa: B018


def run_example(script: str, ranks: int, timeout: float = 600.0) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    if ranks == 1:
        command = [sys.executable, script]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", script]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.mark.parametrize("ranks", [1, 2])
def test_custom_model_example_runs(ranks: int) -> None:
    out = run_example("examples/custom_model.py", ranks)
    line = re.search(rf"GIN on {ranks} rank\(s\): test accuracy ([0-9.]+)", out)
    assert line, out
    # 5 planted communities: chance is 0.2; the structure makes them easy to find.
    assert float(line.group(1)) > 0.6, out
