from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpuledger_common.settings import SettingsError, computed_option, describe, load, option, require


@dataclass(frozen=True, slots=True)
class Example:
    """an example service"""

    url: str = option("nats://localhost:4222", "where")
    port: int = option(8080, "port")
    ratio: float = option(0.5, "a fraction")
    verbose: bool = option(False, "chatty")
    token: str = option("", "a secret", secret=True)

    def __post_init__(self) -> None:
        require(0 <= self.port < 65536, "port", "must be 0..65535")
        require(0 < self.ratio <= 1, "ratio", "must be in (0, 1]")


def test_defaults_stand_without_flags_or_env() -> None:
    assert load(Example, [], {}) == Example()


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--port", "9000"], {}, Example(port=9000)),
        ([], {"GPULEDGER_PORT": "9001"}, Example(port=9001)),
        (["--port=9000"], {"GPULEDGER_PORT": "9001"}, Example(port=9000)),
        ([], {"GPULEDGER_RATIO": "0.25", "GPULEDGER_URL": "tls://x:1"}, Example(ratio=0.25, url="tls://x:1")),
        (["--ratio", "1"], {"GPULEDGER_RATIO": "0.1"}, Example(ratio=1.0)),
        ([], {"PORT": "1", "GPULEDGER_port": "2"}, Example()),  # only the exact upper-case name counts
    ],
)
def test_flags_win_over_env_which_wins_over_defaults(argv: list[str], env: dict[str, str], expected: Example) -> None:
    assert load(Example, argv, env) == expected


@pytest.mark.parametrize(
    ("argv", "env", "verbose"),
    [
        ([], {}, False),
        (["--verbose"], {}, True),
        (["--no-verbose"], {"GPULEDGER_VERBOSE": "true"}, False),
        (["--verbose"], {"GPULEDGER_VERBOSE": "0"}, True),
        ([], {"GPULEDGER_VERBOSE": "1"}, True),
        ([], {"GPULEDGER_VERBOSE": "YES"}, True),
        ([], {"GPULEDGER_VERBOSE": "on"}, True),
        ([], {"GPULEDGER_VERBOSE": "off"}, False),
        ([], {"GPULEDGER_VERBOSE": "no"}, False),
        ([], {"GPULEDGER_VERBOSE": ""}, False),
    ],
)
def test_bool_flags(argv: list[str], env: dict[str, str], verbose: bool) -> None:
    assert load(Example, argv, env).verbose is verbose


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--port", "http"], {}, "--port: 'http' is not a valid int"),
        ([], {"GPULEDGER_PORT": "80.5"}, "GPULEDGER_PORT: '80.5' is not a valid int"),
        ([], {"GPULEDGER_RATIO": "half"}, "GPULEDGER_RATIO: 'half' is not a valid float"),
        ([], {"GPULEDGER_VERBOSE": "maybe"}, "GPULEDGER_VERBOSE: 'maybe' is not a valid bool"),
        (["--port", "70000"], {}, "port: must be 0..65535"),
        ([], {"GPULEDGER_RATIO": "0"}, "ratio: must be in (0, 1]"),
    ],
)
def test_a_bad_value_names_the_flag_or_variable(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load(Example, argv, env)
    assert str(caught.value) == message


def test_a_flag_with_a_bad_value_is_reported_even_when_env_is_good() -> None:
    with pytest.raises(SettingsError, match="--port"):
        load(Example, ["--port", "x"], {"GPULEDGER_PORT": "1"})


def test_describe_redacts_secrets_that_are_set() -> None:
    shown = describe(Example(token="s3cr3t", port=1))
    assert shown == {
        "url": "nats://localhost:4222",
        "port": 1,
        "ratio": 0.5,
        "verbose": False,
        "token": "***",
    }
    assert "s3cr3t" not in repr(shown)


def test_describe_shows_an_unset_secret_as_unset() -> None:
    assert describe(Example())["token"] == ""


def test_the_help_names_the_env_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        load(Example, ["--help"], {}, prog="example")
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "GPULEDGER_PORT" in out
    assert "--no-verbose" in out


@dataclass(frozen=True, slots=True)
class Named:
    """a service with the loader's extras: aliases, more variables, lists, a computed default"""

    url: str = option("nats://a:1", "where", aliases=("--nats",))
    node: str = computed_option(lambda: "the-host", "who", shown="the host name", env=("NODE_NAME",))
    ignored: frozenset[int] = option(frozenset({13}), "numbers")
    names: tuple[str, ...] = option((), "names")


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], {}, Named()),
        (["--nats", "tls://b:2"], {}, Named(url="tls://b:2")),
        (["--url", "tls://c:3"], {}, Named(url="tls://c:3")),
        ([], {"NODE_NAME": "k8s"}, Named(node="k8s")),
        ([], {"NODE_NAME": "k8s", "GPULEDGER_NODE": "ours"}, Named(node="ours")),  # ours first
        (["--ignored", "13, 43,,"], {}, Named(ignored=frozenset({13, 43}))),
        ([], {"GPULEDGER_IGNORED": ""}, Named(ignored=frozenset())),
        (["--names", "a,b"], {}, Named(names=("a", "b"))),
    ],
)
def test_aliases_more_variables_and_lists(argv: list[str], env: dict[str, str], expected: Named) -> None:
    assert load(Named, argv, env) == expected
    assert Named().node == "the-host"


def test_a_bad_list_names_the_flag() -> None:
    with pytest.raises(SettingsError, match=r"^--ignored: '1,x' is not a comma-separated list of int$"):
        load(Named, ["--ignored", "1,x"], {})


@pytest.mark.parametrize(
    ("argv", "verbose"),
    [(["--verbose", "false"], False), (["--verbose", "yes"], True), (["--verbose=off"], False)],
)
def test_a_switch_also_takes_a_value(argv: list[str], verbose: bool) -> None:
    assert load(Example, argv, {}).verbose is verbose


def test_the_help_names_aliases_and_every_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load(Named, ["--help"], {}, prog="named")
    out = " ".join(capsys.readouterr().out.split())  # as one line: argparse wraps the help
    assert "--url URL, --nats URL" in out and "env GPULEDGER_NODE, NODE_NAME" in out and "the host name" in out


def test_describe_shows_a_set_in_order() -> None:
    assert describe(Named(ignored=frozenset({43, 13})))["ignored"] == [13, 43]
