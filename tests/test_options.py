"""One configuration: shared option sections, TOML recipes over defaults, warnings for options without effect."""

import argparse
import importlib.util
import logging
from pathlib import Path

import pytest

from gnnscale.options import OPTIONS, PER_MODEL, given_options, parse_with_recipe, warn_no_effect
from gnnscale.temporal import cli as temporal_cli
from gnnscale.train import cli as train_cli

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
# Same name, but a per-command meaning: the loaders' catalogues, seed nodes per rank vs events per global step,
# GAT heads/dropout vs TGN's attention, a synthetic graph's nodes vs a synthetic stream's, feature rows and
# halo embeddings vs node memory rows on the wire (the same choices: both commands take WIRE_DTYPES).
PER_COMMAND = {"--help", "--dataset", "--batch-size", "--heads", "--dropout", "--num-nodes", "--wire-dtype"}


def actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {name: action for name, action in parser._option_string_actions.items() if name.startswith("--")}


def parse_train(argv: list[str]) -> argparse.Namespace:
    return parse_with_recipe(train_cli.build_parser(), train_cli._join_negative_fanouts(argv))


def test_options_in_both_commands_have_one_name_help_and_default():
    node, temporal = actions(train_cli.build_parser()), actions(temporal_cli.build_parser())
    common = set(node) & set(temporal)
    assert common - set(OPTIONS) == PER_COMMAND  # any other option in both must be defined once, in OPTIONS
    for name in common & set(OPTIONS):
        a, b = node[name], temporal[name]
        assert (a.help, a.type, a.dest) == (b.help, b.type, b.dest), name
        assert a.default == b.default or a.dest in PER_MODEL, name
    assert node["--failure-timeout"].default == temporal["--failure-timeout"].default == 120.0
    assert node["--patience"].default == temporal["--patience"].default == 0
    assert (node["--lr"].default, temporal["--lr"].default) == (0.01, None)  # None: the temporal trainer's default_lr
    assert node["--wire-dtype"].choices == temporal["--wire-dtype"].choices and \
        node["--wire-dtype"].default == temporal["--wire-dtype"].default == "float32"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    return path


def test_command_line_wins_over_the_recipe_which_wins_over_defaults(tmp_path):
    path = write(tmp_path, 'dataset = "cora"\nlr = 0.05\nfanouts = [-1, -1]\nresidual = true\nquiet = false\n')
    args = parse_train(["--lr", "0.2", "--config", str(path), "--epochs", "3"])
    assert (args.dataset, args.lr, args.fanouts, args.residual, args.epochs) == ("cora", 0.2, [-1, -1], True, 3)
    assert (args.hidden, args.quiet) == (256, False)
    assert parse_train(["--config", str(path), "--fanouts", "-1,5"]).fanouts == [-1, 5]
    assert given_options(train_cli.build_parser(), parse_train(["--config", str(path)])) == {
        "config", "dataset", "lr", "fanouts", "residual"}


@pytest.mark.parametrize("text, message", [
    ("num_layers = 2\n", r"unknown key 'num_layers' in .*recipe\.toml; valid keys: .*, num-layers, "),
    ('config = "other.toml"\n', r"unknown key 'config' in .*recipe\.toml"),
    ("residual = 1\n", r"residual in .*recipe\.toml is a switch: write residual = true, or leave it out"),
    ('model = "mlp"\n', r"recipe\.toml: argument --model: invalid choice: 'mlp'"),
    ('fanouts = ["a"]\n', r"recipe\.toml: argument --fanouts: --fanouts 'a' is not a comma-separated list"),
    ("lr = \n", r"recipe\.toml is not valid TOML: "),
])
def test_bad_recipes_are_refused_naming_key_and_file(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        parse_train(["--config", str(write(tmp_path, text))])


def test_a_bad_recipe_is_a_one_line_error_before_anything_runs(tmp_path, capsys):
    for main in (train_cli.main, temporal_cli.main):
        assert main(["--config", str(write(tmp_path, "epoch = 3\n")), "--out", str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: unknown key 'epoch' in ") and "epochs" in err[0]
    with pytest.raises(FileNotFoundError, match="absent.toml"):
        parse_train(["--config", str(tmp_path / "absent.toml")])
    assert not (tmp_path / "run").exists()


def load_accuracy_table():
    spec = importlib.util.spec_from_file_location("accuracy_table", ROOT / "scripts" / "accuracy_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_node_recipes_are_the_accuracy_table_recipes():
    table = load_accuracy_table().RECIPES
    # The temporal and link-prediction recipes are not node classification's accuracy table.
    assert {path.stem for path in RECIPES.glob("*.toml")} - {"wikipedia-tgn", "collegemsg-tgn", "cora-link"} == set(table)
    for name, (dataset, train_args, *_rest) in table.items():
        expected = parse_train(["--dataset", dataset, *train_args])
        got = parse_train(["--config", str(RECIPES / f"{name}.toml")])
        assert vars(got) == {**vars(expected), "config": RECIPES / f"{name}.toml"}, name


@pytest.mark.parametrize("name, argv", [
    ("wikipedia-tgn", "--dataset wikipedia --batch-size 20 --epochs 30 --patience 4 --neighbor-cutoff batch"),
    ("collegemsg-tgn", "--dataset collegemsg --batch-size 20 --epochs 20 --patience 4 --neighbor-cutoff batch"),
])
def test_temporal_recipes_are_the_readme_runs(name, argv):
    assert f"`python scripts/train_temporal.py {argv}`" in (ROOT / "README.md").read_text()
    parser = temporal_cli.build_parser()
    got = parse_with_recipe(parser, ["--config", str(RECIPES / f"{name}.toml")])
    assert vars(got) == {**vars(parser.parse_args(argv.split())), "config": RECIPES / f"{name}.toml"}


@pytest.mark.parametrize("argv, world_size, warned", [
    (["--model", "sage", "--heads", "4", "--attn-dropout", "0.1"], 1, ["--heads", "--attn-dropout"]),
    (["--model", "gat", "--heads", "4"], 1, []),
    (["--dataset", "cora", "--num-nodes", "50"], 1, ["--num-nodes"]),
    (["--dataset", "cora", "--num-nodes", "50", "--partitions", "p"], 2, ["--dataset", "--num-nodes"]),
    (["--data-dir", "somewhere"], 1, ["--data-dir"]),
    (["--features-on-device"], 1, ["--features-on-device"]),
    (["--failure-timeout", "30", "--resume", "--cache-mb", "8"], 1, ["--failure-timeout"]),
    (["--failure-timeout", "30"], 2, []),
])
def test_node_options_without_effect_are_warned_about_once(argv, world_size, warned, caplog):
    parser = train_cli.build_parser()
    with caplog.at_level(logging.WARNING, logger="gnnscale"):
        assert warn_no_effect(parser, parser.parse_args(argv), train_cli.NO_EFFECT, world_size=world_size) == warned
    assert [record.getMessage().split(" has no effect: ")[0] for record in caplog.records] == warned
    if "--heads" in warned:
        assert "--heads has no effect: only --model gat has attention" in caplog.text


def test_temporal_distributed_options_in_one_process_are_warned_about(caplog):
    parser = temporal_cli.build_parser()
    args = parse_with_recipe(parser, ["--config", str(RECIPES / "wikipedia-tgn.toml"), "--staleness", "2",
                                      "--grad-dtype", "bfloat16"])
    with caplog.at_level(logging.WARNING, logger="gnnscale"):
        assert warn_no_effect(parser, args, temporal_cli.NO_EFFECT, world_size=1) == ["--staleness", "--grad-dtype"]
        assert warn_no_effect(parser, args, temporal_cli.NO_EFFECT, world_size=2) == []
    assert caplog.messages == ["--staleness has no effect: one process reads every node memory exactly",
                               "--grad-dtype has no effect: a world of one sums no gradients"]


@pytest.mark.parametrize("mode", ["memory", "epoch"])
def test_sharding_options_with_a_whole_memory_per_rank_are_warned_about(caplog, mode):
    parser = temporal_cli.build_parser()
    args = parser.parse_args(["--parallelism", mode, "--staleness", "2", "--event-split", "owner",
                              "--memory-cache-rows", "100", "--wire-dtype", "int8"])
    with caplog.at_level(logging.WARNING, logger="gnnscale"):
        assert warn_no_effect(parser, args, temporal_cli.NO_EFFECT, world_size=2) == [
            "--staleness", "--memory-cache-rows", "--event-split", "--wire-dtype"]
        assert warn_no_effect(parser, args, temporal_cli.NO_EFFECT, world_size=1) == [
            "--staleness", "--event-split", "--parallelism", "--memory-cache-rows", "--wire-dtype"]
    assert caplog.messages[0] == "--staleness has no effect: each rank reads its own whole memory exactly"
    assert caplog.messages[3] == "--wire-dtype has no effect: each rank holds every node memory: no memory row " \
        "crosses ranks"
    assert caplog.messages[-1] == "--wire-dtype has no effect: a world of one sends no rows over a wire"
