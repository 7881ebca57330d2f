"""Per-client read/write rules: parsing names the bad key, the union of matching rules,
global exclusivity, precise refusals, and covers/overlaps checked against a set model."""

from __future__ import annotations

import datetime
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minou.auth import rules as rules_mod
from minou.auth.rules import ALLOW_ALL, Access, Rule, Rules, covers, overlaps
from minou.errors import ConfigError, ErrorCode, InvalidChannel, NotAuthorized
from minou.names import parse_pattern

EXAMPLE = [
    {"client": "billing-*", "read": ["orders/*", "!invoice/*"],
     "write": ["invoice/v1/*", "audit/v1/log"]},
    {"client": "*", "read": ["public/*"]},
]


def refusal(check, target: str) -> NotAuthorized:
    with pytest.raises(NotAuthorized) as info:
        check(target)
    return info.value


@pytest.fixture
def example() -> Rules:
    return Rules.parse(EXAMPLE)


# --- parsing -----------------------------------------------------------------


def test_parse_builds_rules_and_global_exclusive(example: Rules) -> None:
    assert example.rules == (
        Rule(client="billing-*", read=("orders/*",), write=("invoice/v1/*", "audit/v1/log"),
             exclusive=("invoice/*",), accept=True),
        Rule(client="*", read=("public/*",), write=(), exclusive=(), accept=True),
    )
    assert example.exclusive == ("invoice/*",)
    assert bool(example) is True


def test_exclusive_is_the_union_of_every_rules_bang_entries() -> None:
    rules = Rules.parse([
        {"client": "a", "read": ["!x/*", "!y/v1/*"]},
        {"client": "b", "read": ["!x/*", "!z/v2/7", "w/*"]},
    ])
    assert rules.exclusive == ("x/*", "y/v1/*", "z/v2/7")


@pytest.mark.parametrize("pattern", [
    "*", "orders/*", "orders/v1/*", "orders/v1/42", "_dead/orders/*", "_dead/orders/v1/*",
    "_dead/orders/v1/42", "a-b_c/v123/x%2Fy",
])
def test_valid_patterns_parse_in_read_and_write(pattern: str) -> None:
    rules = Rules.parse([{"client": "*", "read": [pattern, "!" + pattern], "write": [pattern]}])
    assert rules.rules[0].read == (pattern,)
    assert rules.rules[0].exclusive == (pattern,)
    assert rules.rules[0].write == (pattern,)


def test_bad_pattern_message_names_key_and_the_allowed_forms() -> None:
    with pytest.raises(ConfigError) as info:
        Rules.parse([{"client": "*", "read": ["orders/*", "orders/v1/x*"]}])
    assert str(info.value) == (
        'rules[0].read[1]: \'orders/v1/x*\' is not a channel pattern (use "*", "endpoint/*", '
        '"endpoint/version/*", "endpoint/version/id" or "kv/<bucket>")'
    )


def test_kv_bucket_is_a_short_name_for_its_channel() -> None:
    rules = Rules.parse([{"client": "app", "read": ["kv/config"], "write": ["kv/config"]}])
    access = rules.for_client("app")
    access.check_read("_kv/v1/config")
    access.check_write("_kv/v1/config")
    assert not access.may_read("_kv/v1/other")
    assert not access.may_read("kv/v1/config")  # the endpoint "kv" is another thing
    with pytest.raises(ConfigError, match="'kv/a b' is not a channel pattern"):
        Rules.parse([{"client": "a", "read": ["kv/a b"]}])


@pytest.mark.parametrize("pattern", [
    "", "orders", "orders/v1", "orders/V1/*", "orders/*/x", "orders/*/*", "_dead/*", "**",
    "*/v1/x", "orders/v1/a/b", "orders/v0/*", "or ders/*", "!", "!!orders/*", "! orders/*",
])
@pytest.mark.parametrize("where", ["read", "write"])
def test_bad_patterns_are_refused_naming_the_key(pattern: str, where: str) -> None:
    raw = [{"client": "a", "read": ["public/*"]},
           {"client": "b", where: ["x/*", "x/v1/*", pattern]}]
    with pytest.raises(ConfigError) as info:
        Rules.parse(raw)
    assert str(info.value).startswith(f"rules[1].{where}[2]: {pattern!r}")


@pytest.mark.parametrize(("raw", "message"), [
    ({"client": "*"}, "rules: expected a list of tables ([[rules]]), got table"),
    ("x", "rules: expected a list of tables ([[rules]]), got string"),
    (["x"], "rules[0]: expected a table, got string"),
    ([{"client": "*", "wirte": ["a/*"]}],
     "rules[0].wirte: unknown key (known: accept, client, read, write)"),
    ([{"client": "*"}, {"read": ["a/*"]}], "rules[1].client: missing"),
    ([{"client": 5}], "rules[0].client: expected a string, got integer"),
    ([{"client": "a"}, {"client": "b"}, {"client": ""}], "rules[2].client: must not be empty"),
    ([{"client": "*", "read": "orders/*"}],
     'rules[0].read: expected a list of channel patterns, got string (write read = ["..."])'),
    ([{"client": "*", "write": {"a": 1}}],
     "rules[0].write: expected a list of channel patterns, got table$"),  # no hint
    ([{"client": "*", "read": ["a/*", 3]}],
     "rules[0].read[1]: expected a channel pattern string, got integer"),
    ([{"client": "*", "write": ["a/*", "!b/*"]}],
     "rules[0].write[1]: '!b/*': '!' (exclusive) is only allowed in read"),
    ([{"client": "*", "accept": "yes"}], "rules[0].accept: expected true or false, got string"),
    ([{"client": "*", "accept": 1}], "rules[0].accept: expected true or false, got integer"),
    # Every TOML type by its TOML name (what the operator wrote), others by Python's.
    ([{"client": 1.5}], "rules[0].client: expected a string, got float"),
    ([{"client": True}], "rules[0].client: expected a string, got boolean"),
    ([{"client": ["a"]}], "rules[0].client: expected a string, got list"),
    ([{"client": ("a",)}], "rules[0].client: expected a string, got list"),
    ([{"client": None}], "rules[0].client: expected a string, got NoneType"),
    ([{"client": datetime.date(2024, 1, 1)}], "rules[0].client: expected a string, got date"),
])
def test_parse_errors_name_the_key(raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Rules.parse(raw)
    if message.endswith("$"):
        assert str(info.value) == message[:-1]
    else:
        assert str(info.value).startswith(message)


def test_accept_defaults_to_true_and_read_write_to_empty() -> None:
    rule = Rules.parse([{"client": "x"}]).rules[0]
    assert rule == Rule(client="x", read=(), write=(), exclusive=(), accept=True)


def test_duplicate_patterns_are_kept_once() -> None:
    rule = Rules.parse([{"client": "x", "read": ["a/*", "a/*", "!b/*", "!b/*"]}]).rules[0]
    assert (rule.read, rule.exclusive) == (("a/*",), ("b/*",))


# --- no rules ----------------------------------------------------------------


@pytest.mark.parametrize("raw", [None, []])
def test_no_rules_allow_everything_and_nothing_is_exclusive(raw: object) -> None:
    rules = Rules.parse(raw)
    assert not rules
    assert rules.exclusive == ()
    assert rules.accepts("anyone") is None
    assert rules.is_exclusive("invoice/v1/1") is False
    access = rules.for_client("anyone")
    assert access.unrestricted and access.client_id == "anyone"
    for target in ("orders/v1/1", "orders/v1/*", "_dead/orders/v1/1"):
        access.check_write(target)
        assert access.may_write(target)
    for pattern in ("orders/*", "orders/v1/*", "orders/v1/1", "_dead/orders/*"):
        access.check_read(pattern)
        assert access.may_read(pattern)
    assert access.describe() == {"read": ["*"], "write": ["*"], "exclusive": []}
    assert rules.describe() == []


def test_allow_all() -> None:
    assert ALLOW_ALL.unrestricted and ALLOW_ALL.client_id == "*"
    ALLOW_ALL.check_write("a/v1/1")
    ALLOW_ALL.check_read("a/*")
    assert ALLOW_ALL.may_read("_dead/a/v1/*") and ALLOW_ALL.may_write("a/v1/*")


# --- client globs and the union of rules ----------------------------------------


@pytest.mark.parametrize(("glob", "client", "expected"), [
    ("*", "anything", True),
    ("*", "", True),
    ("billing-*", "billing-7", True),
    ("billing-*", "billing-", True),
    ("billing-*", "xbilling-7", False),
    ("billing-*", "Billing-7", False),
    ("*-prod", "api-prod", True),
    ("*-prod", "api-prod2", False),
    ("a*b*c", "a--b--c", True),
    ("a*b*c", "acb", False),
    ("a?b", "a?b", True),
    ("a?b", "axb", False),
    ("x[1]", "x[1]", True),
    ("x[1]", "x1", False),
    ("x[!a]", "xb", False),
    ("a.b", "axb", False),
    ("a.b", "a.b", True),
    ("exact", "exact", True),
    ("exact", "exact2", False),
])
def test_client_glob_only_star_is_special(glob: str, client: str, expected: bool) -> None:
    rules = Rules.parse([{"client": glob, "write": ["a/*"]}])
    assert rules.for_client(client).may_write("a/v1/1") is expected
    assert rules.accepts(client) is expected


def test_permissions_are_the_union_of_every_matching_rule(example: Rules) -> None:
    billing = example.for_client("billing-7")
    for pattern in ("orders/*", "orders/v2/*", "orders/v1/9", "public/*", "public/v1/1",
                    "invoice/v1/3"):
        billing.check_read(pattern)
    for target in ("invoice/v1/3", "invoice/v1/*", "audit/v1/log"):
        billing.check_write(target)
    assert billing.describe() == {"read": ["orders/*", "public/*"],
                                  "write": ["invoice/v1/*", "audit/v1/log"],
                                  "exclusive": ["invoice/*"]}
    other = example.for_client("web-1")
    other.check_read("public/v1/*")
    assert not other.may_read("orders/*")
    assert not other.may_write("public/v1/1")
    assert other.describe() == {"read": ["public/*"], "write": [], "exclusive": []}


def test_write_union_across_rules() -> None:
    rules = Rules.parse([{"client": "a*", "write": ["x/*"]}, {"client": "*b", "write": ["y/v1/*"]}])
    ab = rules.for_client("ab")
    assert ab.may_write("x/v1/1") and ab.may_write("y/v1/*")
    assert rules.for_client("a").may_write("x/v1/1")
    assert not rules.for_client("a").may_write("y/v1/1")
    assert not rules.for_client("b").may_write("x/v1/1")


def test_client_matching_no_rule_may_do_nothing() -> None:
    rules = Rules.parse([{"client": "billing-*", "read": ["*"], "write": ["*"]}])
    access = rules.for_client("x")
    assert not access.matched and not access.unrestricted
    expected = "client 'x' matches no rule: it may not read or write anything"
    assert refusal(access.check_read, "a/v1/1").message == expected
    assert refusal(access.check_write, "a/v1/1").message == expected
    assert access.describe() == {"read": [], "write": [], "exclusive": []}
    assert rules.accepts("x") is False


@pytest.mark.parametrize(("accepts", "expected"), [
    ((True,), True), ((False,), False), ((False, True), True), ((True, False), True),
    ((False, False), False),
])
def test_accepts_when_some_matching_rule_accepts(accepts: tuple[bool, ...], expected: bool
                                                 ) -> None:
    raw = [{"client": "c*", "accept": flag} for flag in accepts]
    raw.append({"client": "other", "accept": True})  # does not match: must not count
    assert Rules.parse(raw).accepts("c1") is expected


def test_rules_describe(example: Rules) -> None:
    assert example.describe() == [
        {"client": "billing-*", "read": ["orders/*", "!invoice/*"],
         "write": ["invoice/v1/*", "audit/v1/log"], "accept": True},
        {"client": "*", "read": ["public/*"], "write": [], "accept": True},
    ]


# --- refusals: precise messages ------------------------------------------------------


def test_write_refusal_message_and_detail(example: Rules) -> None:
    err = refusal(example.for_client("billing-7").check_write, "orders/v1/42")
    assert err.message == ("client 'billing-7' may not write to 'orders/v1/42' "
                           "(write allowed: invoice/v1/*, audit/v1/log)")
    assert err.detail == {"channel": "orders/v1/42", "client": "billing-7"}
    assert err.code == ErrorCode.NOT_AUTHORIZED


def test_write_refusal_with_nothing_allowed(example: Rules) -> None:
    err = refusal(example.for_client("x").check_write, "public/v1/*")
    assert err.message == "client 'x' may not write to 'public/v1/*' (write allowed: nothing)"


def test_read_refusal_message_and_detail(example: Rules) -> None:
    err = refusal(example.for_client("x").check_read, "orders/*")
    assert err.message == "client 'x' may not read 'orders/*' (read allowed: public/*)"
    assert err.detail == {"channel": "orders/*", "client": "x"}


def test_read_refusal_lists_exclusive_entries_with_bang(example: Rules) -> None:
    err = refusal(example.for_client("billing-1").check_read, "secret/v1/1")
    assert err.message == ("client 'billing-1' may not read 'secret/v1/1' "
                           "(read allowed: orders/*, public/*, !invoice/*)")


def test_broadcast_needs_a_write_pattern_covering_every_channel() -> None:
    access = Rules.parse([{"client": "*", "write": ["a/v1/1", "a/v1/2", "b/v1/*"]}]
                         ).for_client("c")
    assert not access.may_write("a/v1/*")  # exact channels never grant a broadcast
    assert access.may_write("b/v1/*")
    assert not access.may_write("b/v2/*")


# --- exclusivity -----------------------------------------------------------------


def test_wildcard_on_an_exclusive_pattern_is_refused_with_a_concrete_example(example: Rules
                                                                            ) -> None:
    err = refusal(example.for_client("billing-7").check_read, "invoice/*")
    assert err.message == ("'invoice/*' is exclusive (!invoice/*): listen on a concrete "
                           "channel such as invoice/v1/<id>, not a wildcard")
    assert err.detail == {"channel": "invoice/*", "client": "billing-7"}
    err = refusal(example.for_client("billing-7").check_read, "invoice/v3/*")
    assert err.message == ("'invoice/v3/*' is exclusive (!invoice/*): listen on a concrete "
                           "channel such as invoice/v3/<id>, not a wildcard")


@pytest.mark.parametrize(("exclusive", "wildcard", "example"), [
    ("*", "*", "endpoint/v1/<id>"),
    ("invoice/*", "_dead/invoice/*", "_dead/invoice/v1/<id>"),  # its dead letters' twin
    ("invoice/v2/*", "_dead/invoice/*", "_dead/invoice/v2/<id>"),
    ("a/*", "_dead/a/*", "_dead/a/v1/<id>"),
    ("invoice/v2/7", "invoice/*", "invoice/v2/7"),
])
def test_the_example_a_wildcard_refusal_gives_is_a_channel_to_listen_on(
        exclusive: str, wildcard: str, example: str) -> None:
    rules = Rules.parse([{"client": "*", "read": ["*", f"!{exclusive}"]}])
    err = refusal(rules.for_client("c").check_read, wildcard)
    assert f"such as {example}, not a wildcard" in err.message
    channel = example.replace("<id>", "1")
    assert rules.for_client("c").may_read(channel) and rules.is_exclusive(channel)


def test_concrete_channel_covered_only_by_a_bang_entry_is_readable(example: Rules) -> None:
    example.for_client("billing-7").check_read("invoice/v1/55")
    assert example.is_exclusive("invoice/v1/55")
    # The '!' entry belongs to billing-*: others cannot read it at all.
    assert not example.for_client("web").may_read("invoice/v1/55")


def test_exclusivity_is_global_even_for_read_star() -> None:
    rules = Rules.parse([
        {"client": "billing-*", "read": ["!invoice/*"]},
        {"client": "admin", "read": ["*"]},
    ])
    admin = rules.for_client("admin")
    for wildcard in ("invoice/*", "invoice/v1/*", "*"):
        err = refusal(admin.check_read, wildcard)
        assert "(!invoice/*)" in err.message and "not a wildcard" in err.message
        assert err.detail["client"] == "admin"
    # Concrete channels under the exclusive pattern stay readable: the reservation decides.
    admin.check_read("invoice/v1/1")
    admin.check_read("_dead/invoice/v1/1")
    # The dead letters of exclusive channels are exclusive with them.
    for wildcard in ("_dead/invoice/*", "_dead/invoice/v1/*"):
        err = refusal(admin.check_read, wildcard)
        assert "(the dead letters of !invoice/*)" in err.message
    # Wildcards elsewhere are not exclusive.
    for wildcard in ("orders/*", "invoic/*", "invoices/*", "_dead/invoices/*"):
        admin.check_read(wildcard)


def test_wider_wildcard_that_includes_exclusive_channels() -> None:
    rules = Rules.parse([{"client": "*", "read": ["orders/*", "!orders/v2/*"]}])
    err = refusal(rules.for_client("c").check_read, "orders/*")
    assert err.message == ("'orders/*' includes exclusive channels (!orders/v2/*): listen on a "
                           "concrete channel such as orders/v2/<id>, not a wildcard")
    rules.for_client("c").check_read("orders/v1/*")
    rules.for_client("c").check_read("orders/v2/8")


def test_exclusive_concrete_channel() -> None:
    rules = Rules.parse([{"client": "*", "read": ["a/*", "!a/v1/1"]}])
    access = rules.for_client("c")
    err = refusal(access.check_read, "a/v1/*")
    assert "such as a/v1/1," in err.message
    assert access.may_read("a/v2/*")
    assert rules.is_exclusive("a/v1/1")
    assert not rules.is_exclusive("a/v1/12")  # a concrete pattern is not a prefix
    assert rules.is_exclusive("_dead/a/v1/1")  # its dead letters, with it
    assert not rules.is_exclusive("_dead/a/v1/12")


def test_is_exclusive_for_prefix_patterns(example: Rules) -> None:
    assert example.is_exclusive("invoice/v9/x")
    assert not example.is_exclusive("invoices/v1/x")
    assert not example.is_exclusive("orders/v1/x")


def test_writes_ignore_exclusivity() -> None:
    rules = Rules.parse([{"client": "*", "read": ["!a/*"], "write": ["a/*"]}])
    rules.for_client("c").check_write("a/v1/*")


def test_dead_letters_need_a_rule_naming_them() -> None:
    rules = Rules.parse([{"client": "p", "read": ["orders/*"]},
                         {"client": "q", "read": ["_dead/orders/*"]},
                         {"client": "r", "read": ["*"]}])
    assert not rules.for_client("p").may_read("_dead/orders/v1/1")
    assert rules.for_client("q").may_read("_dead/orders/v1/*")
    assert not rules.for_client("q").may_read("orders/v1/1")
    assert rules.for_client("r").may_read("_dead/orders/v1/1")


def test_malformed_names_raise_invalid_channel_and_may_answers_false(example: Rules) -> None:
    access = example.for_client("billing-7")
    with pytest.raises(InvalidChannel):
        access.check_write("orders")
    with pytest.raises(InvalidChannel):
        access.check_read("orders/v1/a/b")
    assert not access.may_write("orders")
    assert not access.may_read("")


# --- caches ------------------------------------------------------------------------


def test_for_client_is_cached_and_a_new_rules_starts_fresh(example: Rules) -> None:
    assert example.for_client("billing-7") is example.for_client("billing-7")
    assert Rules.parse(EXAMPLE).for_client("billing-7") is not example.for_client("billing-7")


def test_repeated_checks_give_the_same_answer(example: Rules) -> None:
    access = example.for_client("billing-7")
    for _ in range(3):
        access.check_write("invoice/v1/1")
        assert refusal(access.check_write, "orders/v1/1").message.startswith(
            "client 'billing-7' may not write to 'orders/v1/1'")
        access.check_read("orders/*")
        assert "exclusive" in refusal(access.check_read, "invoice/*").message


def test_bounded_caches_do_not_change_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rules_mod, "RULES_CACHE_ENTRIES", 3)
    rules = Rules.parse([{"client": "*", "read": ["a/*", "!x/*"], "write": ["a/v1/*"]}])
    access = rules.for_client("c")
    targets = [f"a/v{v}/{i}" for v in (1, 2) for i in range(10)]
    for _ in range(2):
        for target in targets:
            assert access.may_write(target) is target.startswith("a/v1/")
            assert access.may_read(target)
            assert rules.is_exclusive(target) is False
            assert rules.is_exclusive("x/" + target[2:]) is True
            assert not access.may_read("x/*")
        for client in ("c1", "c2", "c3", "c4", "c5"):
            assert rules.for_client(client).may_read("a/*")
            assert len(rules._access) <= 3
    assert len(access._writes) <= 3 and len(access._reads) <= 3
    assert len(rules._access) <= 3 and len(rules._exclusive_seen) <= 3


def test_a_target_seen_once_is_answered_from_the_cache_without_deciding_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # check_write runs for every published message and is_exclusive for every concrete
    # subscription: once a target has been seen, its answer must be one dict lookup, not a
    # new walk over the patterns (a cache stored under the wrong key, or never read, gives
    # the same answers, only recomputed each time).
    decided: list[str] = []
    for name in ("_decide_write", "_decide_read"):
        real = getattr(Access, name)
        monkeypatch.setattr(Access, name, lambda self, target, real=real, name=name: (
            decided.append(f"{name} {target}"), real(self, target))[1])
    matched: list[str] = []
    real_matches = rules_mod.Pattern.matches
    monkeypatch.setattr(rules_mod.Pattern, "matches", lambda self, channel: (
        matched.append(channel), real_matches(self, channel))[1])
    rules = Rules.parse(EXAMPLE)
    access = rules.for_client("billing-7")
    for _ in range(3):
        access.check_write("invoice/v1/1")
        assert not access.may_write("orders/v1/1")
        access.check_read("orders/*")
        assert not access.may_read("invoice/*")
        assert rules.is_exclusive("invoice/v1/1") is True
        assert rules.is_exclusive("orders/v1/1") is False
    assert decided == ["_decide_write invoice/v1/1", "_decide_write orders/v1/1",
                       "_decide_read orders/*", "_decide_read invoice/*"]
    # Two exclusive patterns to try ("invoice/*" and its dead letters'), once per channel.
    assert matched == ["invoice/v1/1", "orders/v1/1", "orders/v1/1"]


def test_accesses_do_not_share_caches() -> None:
    rules = Rules.parse([{"client": "w", "write": ["a/*"]}, {"client": "r", "read": ["a/*"]}])
    assert rules.for_client("w").may_write("a/v1/1")
    assert not rules.for_client("r").may_write("a/v1/1")
    assert not rules.for_client("w").may_read("a/v1/1")


def test_access_can_be_built_directly() -> None:
    access = Access("c", read=["a/*"], write=["b/v1/1"], exclusive=["e/*"],
                    global_exclusive=["e/*", "a/v1/*"])
    assert access.may_read("a/v2/*") and not access.may_read("a/*")
    assert access.may_read("e/v1/1") and not access.may_read("e/*")
    assert access.may_write("b/v1/1") and not access.may_write("b/v1/2")


# --- covers / overlaps against a set model ------------------------------------------

ENDPOINTS = ("a", "ab", "b")
VERSIONS = ("v1", "v2")
IDS = ("1", "12", "x")
UNIVERSE = [f"{dead}{e}/{v}/{i}" for dead in ("", "_dead/")
            for e, v, i in itertools.product(ENDPOINTS, VERSIONS, IDS)]


def _all_patterns() -> dict[str, frozenset[str]]:
    """Every pattern over the small universe, with the channels it matches (by parts)."""
    out: dict[str, frozenset[str]] = {"*": frozenset(UNIVERSE)}
    for dead in ("", "_dead/"):
        for e in ENDPOINTS:
            out[f"{dead}{e}/*"] = frozenset(
                c for c in UNIVERSE if c.startswith(dead) and c[len(dead):].split("/")[0] == e)
            for v in VERSIONS:
                out[f"{dead}{e}/{v}/*"] = frozenset(
                    c for c in UNIVERSE
                    if c.startswith(dead) and c[len(dead):].split("/")[:2] == [e, v])
                for i in IDS:
                    out[f"{dead}{e}/{v}/{i}"] = frozenset({f"{dead}{e}/{v}/{i}"})
    return out


PATTERNS = _all_patterns()
WILDCARDS = [p for p in PATTERNS if p.endswith("*")]


def test_covers_is_set_inclusion_exhaustively() -> None:
    # With two values of every component, "covers" means exactly "every channel the
    # request can reach is matched by the rule" (the union of patterns never counts).
    wrong = [(rule, req) for rule, req in itertools.product(PATTERNS, PATTERNS)
             if covers(rule, req) != (PATTERNS[req] <= PATTERNS[rule])]
    assert wrong == []


def test_overlaps_is_set_intersection_exhaustively() -> None:
    wrong = [(exc, wild) for exc, wild in itertools.product(PATTERNS, WILDCARDS)
             if overlaps(exc, wild) != bool(PATTERNS[exc] & PATTERNS[wild])]
    assert wrong == []


@pytest.mark.parametrize(("rule", "requested", "expected"), [
    ("*", "anything/v1/1", True),
    ("*", "orders/*", True),
    ("orders/*", "orders/v1/*", True),
    ("orders/v1/*", "orders/*", False),
    ("orders/v1/42", "orders/v1/42", True),
    ("orders/v1/42", "orders/v1/420", False),
    ("orders/v1/42", "orders/v1/*", False),
    ("orders/*", "orders2/v1/1", False),
    ("orders/*", "_dead/orders/v1/1", False),
    ("orders/*", "*", False),
])
def test_covers_examples(rule: str, requested: str, expected: bool) -> None:
    assert covers(rule, requested) is expected


name = st.text("ab_-", min_size=1, max_size=3)
version = st.sampled_from(["v1", "v2", "v10"])
ident = st.text("1x~.", min_size=1, max_size=3)
dead = st.sampled_from(["", "_dead/"])
concrete = st.builds(lambda d, e, v, i: f"{d}{e}/{v}/{i}", dead, name, version, ident)
wildcard = st.one_of(
    st.just("*"),
    st.builds(lambda d, e: f"{d}{e}/*", dead, name),
    st.builds(lambda d, e, v: f"{d}{e}/{v}/*", dead, name, version),
)
pattern = st.one_of(concrete, wildcard)


def _matches(p: str, channel: str) -> bool:
    return True if p == "*" else parse_pattern(p).matches(channel)


@settings(max_examples=150)
@given(pattern, wildcard, st.lists(concrete, max_size=20))
def test_covering_a_wildcard_covers_every_channel_it_matches(rule: str, wild: str,
                                                             channels: list[str]) -> None:
    if covers(rule, wild):
        for channel in channels:
            if _matches(wild, channel):
                assert covers(rule, channel)


@settings(max_examples=150)
@given(pattern, concrete)
def test_covers_a_concrete_channel_iff_it_matches(rule: str, channel: str) -> None:
    assert covers(rule, channel) is _matches(rule, channel)


@settings(max_examples=150)
@given(pattern, wildcard, concrete)
def test_a_channel_matched_by_both_means_overlap(exc: str, wild: str, channel: str) -> None:
    if _matches(exc, channel) and _matches(wild, channel):
        assert overlaps(exc, wild)
    assert overlaps(exc, wild) == overlaps(wild, exc)


# --- Access against a model ----------------------------------------------------------

GLOBS = {"*": lambda c: True, "c*": lambda c: c.startswith("c"), "c1": lambda c: c == "c1",
         "d?": lambda c: c == "d?"}
CLIENTS = ("c1", "c2", "d?", "dx", "e")
POOL = ["*", "a/*", "a/v1/*", "a/v1/1", "a/v1/12", "ab/*", "ab/v2/*", "b/v2/x", "_dead/a/*",
        "_dead/a/v1/1"]
rule_strategy = st.fixed_dictionaries(
    {"client": st.sampled_from(sorted(GLOBS))},
    optional={
        "read": st.lists(st.sampled_from(POOL + ["!" + p for p in POOL]), max_size=4),
        "write": st.lists(st.sampled_from(POOL), max_size=3),
        "accept": st.booleans(),
    },
)


@settings(max_examples=150)
@given(st.lists(rule_strategy, max_size=4), st.sampled_from(CLIENTS),
       st.sampled_from(sorted(PATTERNS)))
def test_access_agrees_with_a_set_model(raw: list[dict], client: str, request: str) -> None:
    rules = Rules.parse(raw)
    access = rules.for_client(client)
    if not raw:
        assert access.may_read(request) and access.may_write(request)
        assert rules.accepts(client) is None
        return
    matched = [r for r in raw if GLOBS[r["client"]](client)]
    reads = [p.lstrip("!") for r in matched for p in r.get("read", [])]
    writes = [p for r in matched for p in r.get("write", [])]
    exclusive = [p[1:] for r in raw for p in r.get("read", []) if p.startswith("!")]
    # An exclusive pattern's dead letters are exclusive with it.
    exclusive += ["_dead/" + e for e in exclusive if e != "*" and not e.startswith("_dead/")]
    want = PATTERNS[request]

    may_write = any(want <= PATTERNS[p] for p in writes)
    may_read = any(want <= PATTERNS[p] for p in reads)
    if may_read and request.endswith("*"):
        may_read = not any(PATTERNS[e] & want for e in exclusive)

    assert access.may_write(request) is may_write
    assert access.may_read(request) is may_read
    assert access.may_write(request) is may_write  # second answer comes from the cache
    assert rules.accepts(client) is any(r.get("accept", True) for r in matched)
    assert rules.is_exclusive(UNIVERSE[0]) is any(UNIVERSE[0] in PATTERNS[e] for e in exclusive)
    if not may_read:
        message = refusal(access.check_read, request).message
        if matched:
            assert repr(request) in message
            assert repr(client) in message or "exclusive" in message
        else:
            assert "matches no rule" in message
