"""Typed compile options (`pbsdk.core.options`): parsing, errors, the cache key. No MLIR."""

from __future__ import annotations

import dataclasses

import pytest

from pbsdk.core.errors import OptionsError
from pbsdk.core.options import DEFAULT, Options, TargetOptions, as_options, parse_options


@dataclasses.dataclass(frozen=True)
class ChipOptions(TargetOptions):
    fast_math: bool = False
    lanes: int = 4


def _parse(values: dict) -> Options:
    return parse_options(values, target_options=ChipOptions, target_name="chip")


def test_keys_go_to_the_core_or_the_target() -> None:
    opts = _parse({"threads": 2, "fast_math": True})
    assert opts.threads == 2 and opts.target == ChipOptions(fast_math=True)
    assert opts.target_as(ChipOptions).lanes == 4
    assert _parse({}) == Options(target=ChipOptions())
    assert parse_options(opts) is opts  # parsed options pass through


def test_an_unknown_key_names_itself_and_every_known_key() -> None:
    with pytest.raises(OptionsError) as err:
        _parse({"fastmath": True, "thread": 1})
    msg = str(err.value)
    assert "unknown options 'fastmath', 'thread'" in msg
    assert "the chip target's" in msg and "fast_math" in msg and "lanes" in msg and "threads" in msg
    with pytest.raises(OptionsError, match="unknown option 'fast_math'; known options \\(pbsdk's\\)"):
        parse_options({"fast_math": True})  # no target: only the core's keys are known
    with pytest.raises(OptionsError, match="unknown option 'target'"):
        parse_options({"target": "cpu"})  # the target's options are a field, not a key


@pytest.mark.parametrize("values, message", [
    ({"threads": True}, "option 'threads': must be a non-negative int, got True"),
    ({"threads": -1}, "must be a non-negative int, got -1"),
    ({"fuse_attention": 1}, "pbsdk option 'fuse_attention' must be bool, got 1"),
    ({"matmul_precision": "fast"}, "must be 'exact' or 'tf32' or 'mixed', got 'fast'"),
    ({"entry": 3}, "option 'entry' must be str or None, got 3"),
    ({"pack_b": "yes"}, "option 'pack_b' must be bool or None"),
    ({"lanes": 2.5}, "target 'chip' option 'lanes' must be int, got 2.5"),
])
def test_a_mistyped_value_names_the_option_and_the_type(values: dict, message: str) -> None:
    with pytest.raises(OptionsError, match=message.replace("(", "\\(").replace(")", "\\)")):
        _parse(values)


def test_the_cache_key_covers_every_field_but_cache() -> None:
    base = _parse({})
    assert _parse({"cache": False}).cache_key() == base.cache_key()
    assert _parse({"threads": 0, "fast_math": False}).cache_key() == base.cache_key()  # defaults spelt out
    assert _parse({"threads": 1}).cache_key() != base.cache_key()
    assert _parse({"lanes": 8}).cache_key() != base.cache_key()  # the target's options too
    assert parse_options({}).cache_key() != base.cache_key()  # another target's options type
    hash(base)  # frozen and hashable


def test_replace_and_as_options_check_like_parsing() -> None:
    opts = _parse({"fast_math": True})
    changed = opts.replace(optin_scratchpad=False, double_buffer=False)
    assert (changed.optin_scratchpad, changed.double_buffer, changed.target) == (False, False, opts.target)
    with pytest.raises(OptionsError):
        opts.replace(double_bufer=False)
    assert as_options(None) is DEFAULT and as_options({"threads": 1}).threads == 1
    with pytest.raises(OptionsError):
        as_options({"fast_math": True})


def test_replace_changes_the_parsed_targets_fields_too() -> None:
    opts = _parse({"threads": 2})
    changed = opts.replace(lanes=8, threads=1)
    assert changed.target == ChipOptions(lanes=8) and changed.threads == 1
    assert changed.replace(fast_math=True).target == ChipOptions(fast_math=True, lanes=8)
    with pytest.raises(OptionsError, match="option 'lanes' must be int, got 'x'"):
        opts.replace(lanes="x")
    with pytest.raises(OptionsError, match="unknown option 'lane'; known options \\(pbsdk's and the target's, "
                                           "ChipOptions\\): .*lanes"):
        opts.replace(lane=8)
    with pytest.raises(OptionsError, match="unknown option 'lanes'; known options \\(pbsdk's\\)"):
        DEFAULT.replace(lanes=8)  # parsed without a target: only the core's fields


def test_the_core_asks_the_target_options_and_defaults_to_its_own_behaviour() -> None:
    @dataclasses.dataclass(frozen=True)
    class Unpacked(TargetOptions):
        pack: bool = True

        def isolate_contractions(self) -> bool:
            return self.pack

    assert DEFAULT.target.isolate_contractions() and DEFAULT.target.isolate_epilogues()
    assert _parse({}).target.isolate_contractions()  # a target that does not override the query
    opts = parse_options({"pack": False}, target_options=Unpacked, target_name="unpacked")
    assert not opts.target.isolate_contractions() and opts.target.isolate_epilogues()


def test_target_as_refuses_another_targets_options() -> None:
    @dataclasses.dataclass(frozen=True)
    class Other(TargetOptions):
        x: int = 0

    assert DEFAULT.target_as(Other) == Other()  # nothing parsed for a target: its defaults
    with pytest.raises(OptionsError, match="parsed for ChipOptions"):
        _parse({}).target_as(Other)
