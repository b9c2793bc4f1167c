"""Every onnx2tf 1.29 / 2.x flag of compat_flags.FLAGS is implemented, noted or refused by
the CLI's parser exactly as the table (and docs/cli_flags.md) says; parsing only."""

from __future__ import annotations

import argparse
import os

import pytest

from onnx2tf_alt.cli.args import parser
from onnx2tf_alt.cli.compat_flags import (
    ANY,
    EXPLAINED,
    FLAGS,
    IMPLEMENTED,
    NONE,
    NOTES_DEST,
    REFUSED,
    V1,
    V2,
    flags_of,
    note,
    refusal,
)

from cli_runner import run_cli


def _values(takes: str) -> list[str]:
    return [] if takes == NONE else ["1", "2"] if takes == ANY else ["1"]


def _action(option: str) -> argparse.Action:
    return parser()._option_string_actions[option]


def _sample(action: argparse.Action) -> list[str]:
    """A value the implemented flag's parser entry accepts."""
    if action.nargs == 0:
        return []
    if action.choices:
        return [next(str(c) for c in action.choices if c != action.default)]
    return ["1"]


def test_both_flag_lists_are_complete():
    """The table holds onnx2tf 1.29.24's 64 flags and 2.6.9's 89 (read from their argparse
    definitions), each named once per version."""
    assert len(flags_of(V1)) == 64 and len(flags_of(V2)) == 89
    for version in (V1, V2):
        rows = flags_of(version)
        assert len({r.short for r in rows}) == len({r.long for r in rows}) == len(rows)


@pytest.mark.parametrize("flag", [f for f in FLAGS if f.status == IMPLEMENTED],
                         ids=lambda f: f.short)
def test_implemented_flag_sets_its_option(flag):
    action = _action(flag.short)
    assert flag.long in action.option_strings, (flag.short, action.option_strings)
    if isinstance(action, argparse._VersionAction):
        with pytest.raises(SystemExit) as exit_info:
            parser().parse_args([flag.short])
        assert exit_info.value.code == 0
        return
    for name in (flag.short, flag.long):
        args = parser().parse_args(["-i", "m.onnx", name, *_sample(action)])
        assert getattr(args, action.dest) != action.default, name
        assert getattr(args, NOTES_DEST) == []


@pytest.mark.parametrize("flag", [f for f in FLAGS if f.status == EXPLAINED],
                         ids=lambda f: f.short)
def test_explained_flag_is_noted_and_consumes_its_values(flag):
    for name in (flag.short, flag.long):
        args = parser().parse_args([name, *_values(flag.takes), "-o", "out"])
        assert getattr(args, NOTES_DEST) == [note(flag, name)]
        assert args.output_folder_path == "out"  # the flag took its own values, no more


@pytest.mark.parametrize("flag", [f for f in FLAGS if f.status == REFUSED],
                         ids=lambda f: f.short)
def test_refused_flag_exits_2_naming_the_equivalent(flag, capsys):
    for name in (flag.short, flag.long):
        with pytest.raises(SystemExit) as exit_info:
            parser().parse_args(["-i", "m.onnx", name, *_values(flag.takes)])
        assert exit_info.value.code == 2
        assert refusal(flag, name) in capsys.readouterr().err


def test_joined_short_flags_and_prefixes_are_not_guessed(capsys):
    """argparse would read -ofgd as -o fgd and -nuo as -n uo; --output_fold is no prefix."""
    args = parser().parse_args(["-ofgd", "-nuo"])
    assert args.output_folder_path == "saved_model" and not args.non_verbose
    assert len(getattr(args, NOTES_DEST)) == 2
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_args(["--output_fold", "x"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --output_fold" in capsys.readouterr().err


def test_kat_adds_to_k_and_quant_norm_takes_onnx2tf_lists():
    args = parser().parse_args(["-kat", "a", "-k", "b", "-qnm", "[[[[0.485, 0.456, 0.406]]]]",
                                "-qns", "0.2", "0.3"])
    assert args.keep_ncw_or_nchw_or_ncdhw_input_names == ["a", "b"]
    assert args.quant_norm_mean == [0.485, 0.456, 0.406]
    assert args.quant_norm_std == [0.2, 0.3]


def test_cli_prints_notes_and_refuses_before_converting(tmp_path):
    code, output = run_cli("-i", tmp_path / "missing.onnx", "-o", tmp_path / "out", "-prf",
                           "replace.json", "-dsm")
    assert code == 2 and "missing.onnx" in output
    prf, dsm = (next(f for f in FLAGS if f.short == s) for s in ("-prf", "-dsm"))
    assert note(prf, "-prf") in output and note(dsm, "-dsm") in output
    code, output = run_cli("-i", tmp_path / "missing.onnx", "-n", "-prf", "replace.json")
    assert code == 2 and "note:" not in output  # -n: errors only
    code, output = run_cli("-i", tmp_path / "missing.onnx", "-otfv1pb")
    assert code == 2 and "use the saved_model" in output
    assert not (tmp_path / "out").exists()


def test_the_saved_model_is_written_when_asked_as_onnx2tf_2x_writes_it(tmp_path):
    """No saved_model by default; -fdosm (our -osm) and -tb tf_converter write one, as
    onnx2tf 2.x does, -dms still leaves it out there, and -osm with -dms is refused."""
    model = os.path.join(os.path.dirname(__file__), "..", "data", "mobilenet_block.onnx")

    def saved_model(*flags, expect=0) -> bool:
        out = tmp_path / "_".join(f.strip("-") for f in flags or ("default",))
        code, output = run_cli("-i", model, "-o", out, "-n", *flags)
        assert code == expect, output
        assert expect == 0 or not out.exists()
        return (out / "saved_model.pb").is_file()

    assert not saved_model()
    assert saved_model("-fdosm")
    assert saved_model("-tb", "tf_converter")
    assert not saved_model("-tb", "tf_converter", "-dms")
    assert not saved_model("-osm", "-dms", expect=2)
