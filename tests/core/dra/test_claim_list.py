"""A ResourceClaim LIST page read claim by claim (`core.dra.claim_list`): a claim that
cannot be decoded (nested past the decoder's depth, as any tenant may write opaque
parameters) is stepped over and named, and costs only itself."""

from __future__ import annotations

import json
import sys

import pytest

from gpuslice.core.dra.claim_list import MAX_NESTING, read_page


def item(name: str, uid: str, parameters: str = "{}") -> str:
    meta = json.dumps({"name": name, "namespace": "ml", "uid": uid})
    return f'{{"metadata": {meta}, "spec": {{"x": {parameters}}}}}'


def page(*items: str, token: str = "next") -> str:
    return (
        '{"kind": "ResourceClaimList", "apiVersion": "resource.k8s.io/v1", '
        f'"metadata": {{"resourceVersion": "7", "continue": "{token}"}}, '
        f'"items": [{", ".join(items)}]}}'
    )


def test_a_claim_nested_past_the_decoder_is_skipped_and_named() -> None:
    bomb = "[" * 5000 + "]" * 5000
    tricky = json.dumps({"s": 'brackets in a string: [[{{"\\'})
    text = page(item("a", "u-a"), item("bomb", "u-bomb", bomb), item("b", "u-b", tricky))
    read = read_page(text)
    assert [c["metadata"]["uid"] for c in read.items] == ["u-a", "u-b"]
    [bad] = read.unreadable
    assert (bad.uid, bad.namespace, bad.name) == ("u-bomb", "ml", "bomb")
    assert "nested" in bad.error
    assert read.continue_token == "next"


def test_the_depth_bound_holds_whatever_the_recursion_limit() -> None:
    """A claim deeper than MAX_NESTING is unreadable by the agent's own bound, not by
    whether the decoder hits the interpreter's recursion limit: with the limit raised (as a
    test framework, or the call's shallower stack, may leave it) a 1,500-deep bomb decoded
    fine and was kept, and the real-API-server test saw no unreadable claim."""
    deep = "[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1)
    bomb = "[" * 1500 + "]" * 1500
    within = "[" * (MAX_NESTING - 3) + "]" * (MAX_NESTING - 3)  # item and spec add 3 levels
    text = page(
        item("deep", "u-deep", deep), item("bomb", "u-bomb", bomb), item("ok", "u-ok", within)
    )
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        read = read_page(text)
    finally:
        sys.setrecursionlimit(limit)
    assert [c["metadata"]["uid"] for c in read.items] == ["u-ok"]
    assert [b.uid for b in read.unreadable] == ["u-deep", "u-bomb"]
    assert all(f"deeper than {MAX_NESTING}" in b.error for b in read.unreadable)


def test_the_last_page_and_an_empty_one() -> None:
    assert read_page(page(item("a", "u-a"), token="")).continue_token == ""
    empty = read_page('{"kind": "ResourceClaimList", "metadata": {}, "items": null}')
    assert (empty.items, empty.unreadable, empty.continue_token) == ((), (), "")


@pytest.mark.parametrize("text", ["[]", '{"items": [{"a": [}]}', '{"items": [1', ""])
def test_a_page_that_is_not_a_list_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="claim list"):
        read_page(text)
