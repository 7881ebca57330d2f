"""The command table behind COMMAND INFO and COMMAND DOCS, and its syntax parser."""

from __future__ import annotations

import pytest

from minou.protocol.resp import Simple
from minou.protocol.resp_commands import COMMAND_DOCS, docs_reply, info_reply, parse_syntax


def names(args: list[dict]) -> list[str]:
    return [a["name"] for a in args]


def test_every_command_of_the_table_parses_and_names_its_group() -> None:
    for name, doc in COMMAND_DOCS.items():
        d = doc.docs()
        assert d["group"] and d["since"] and d["summary"], name
        assert ("arguments" in d) == bool(doc.syntax), name


def test_a_token_and_its_value_are_one_argument_and_brackets_make_it_optional() -> None:
    (count,) = parse_syntax("[COUNT count]")
    assert count == {"name": "count", "type": "integer", "token": "COUNT",
                     "flags": [Simple("optional")]}
    (block,) = parse_syntax("(LIMIT count)")
    assert block == {"name": "count", "type": "integer", "token": "LIMIT"}


def test_bars_bind_tighter_than_a_sequence_and_groups_are_alternatives() -> None:
    key, choice, field = parse_syntax("key *|id field")
    assert key["type"] == "key" and field == {"name": "field", "type": "string"}
    assert choice["type"] == "oneof" and names(choice["arguments"]) == ["auto-id", "id"]
    (expiry,) = parse_syntax("[(EX seconds)|(PX milliseconds)|KEEPTTL]")
    assert expiry["type"] == "oneof" and expiry["flags"] == [Simple("optional")]
    assert [(a.get("token"), a["type"]) for a in expiry["arguments"]] == \
        [("EX", "integer"), ("PX", "integer"), ("KEEPTTL", "pure-token")]


def test_dots_repeat_the_argument_or_the_group_before_them() -> None:
    key, pairs = parse_syntax("key... (field value)...")
    assert key["flags"] == [Simple("multiple")]
    assert pairs["type"] == "block" and names(pairs["arguments"]) == ["field", "value"]
    assert pairs["flags"] == [Simple("multiple")]
    (opt,) = parse_syntax("[arg...]")
    assert opt["flags"] == [Simple("multiple"), Simple("optional")]


def test_a_block_led_by_a_token_carries_it() -> None:
    (auth,) = parse_syntax("[AUTH username password]")
    assert auth["token"] == "AUTH" and auth["type"] == "block"
    assert names(auth["arguments"]) == ["username", "password"]


@pytest.mark.parametrize("bad", ["[key", "key]", "(a b", "a |", "| a", "...", "[]", "a (])",
                                 "a )"])
def test_unbalanced_syntax_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_syntax(bad)


def test_docs_and_info_replies_name_the_known_commands_only() -> None:
    assert [n for n, _ in docs_reply(["xadd", "nosuch", "GET"])] == ["xadd", "get"]
    assert len(docs_reply([])) == len(COMMAND_DOCS)
    xack, missing = info_reply(["XACK", "nosuch"])
    assert missing is None
    assert xack[:6] == ["xack", -4, [Simple("write"), Simple("denyoom"), Simple("fast")], 1, 1,
                        1]
    assert xack[6] == [Simple("@stream")]
    assert len(info_reply([])) == len(COMMAND_DOCS)


def test_xadds_docs_are_the_tree_redis_cli_builds_its_hints_from() -> None:
    opt, many = [Simple("optional")], [Simple("multiple")]

    def token(word: str, name: str) -> dict:
        return {"name": name, "type": "pure-token", "token": word}

    doc = COMMAND_DOCS["XADD"].docs()
    assert doc["arguments"] == [
        {"name": "key", "type": "key", "key_spec_index": 0},
        {**token("NOMKSTREAM", "nomkstream"), "flags": opt},
        {"name": "maxlen-minid-equal-approximately-threshold", "type": "block", "flags": opt,
         "arguments": [
             {"name": "maxlen-minid", "type": "oneof",
              "arguments": [token("MAXLEN", "maxlen"), token("MINID", "minid")]},
             {"name": "equal-approximately", "type": "oneof", "flags": opt,
              "arguments": [token("=", "equal"), token("~", "approximately")]},
             {"name": "threshold", "type": "integer"}]},
        {"name": "auto-id-id", "type": "oneof",
         "arguments": [token("*", "auto-id"), {"name": "id", "type": "string"}]},
        {"name": "field-value", "type": "block", "flags": many,
         "arguments": [{"name": "field", "type": "string"}, {"name": "value", "type": "string"}]},
    ]


def test_a_token_before_a_token_a_block_or_a_choice_leads_a_block() -> None:
    opt = [Simple("optional")]
    two, block, choice, twice, last = parse_syntax(
        "[FOO BAR] [FOO (a b)] [FOO x|y] [[z]] a|b")
    assert two == {"name": "foo", "type": "block", "token": "FOO", "flags": opt,
                   "arguments": [{"name": "bar", "type": "pure-token", "token": "BAR"}]}
    assert block["token"] == "FOO" and block["type"] == "block"
    assert block["arguments"] == [{"name": "a-b", "type": "block", "arguments": [
        {"name": "a", "type": "string"}, {"name": "b", "type": "string"}]}]
    assert choice["token"] == "FOO" and choice["type"] == "block"
    assert [(a["name"], a["type"]) for a in choice["arguments"]] == [("x-y", "oneof")]
    assert twice == {"name": "z", "type": "string", "flags": opt}  # flagged once
    assert last["type"] == "oneof" and names(last["arguments"]) == ["a", "b"]
