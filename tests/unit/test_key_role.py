"""The native fronts' key check (``key_role``, native/src/front/auth.rs) grants what the
Python reference (``auth.Authenticator.role``) grants, for any header an HTTP client can
send (visible ASCII, spaces and tabs) and any configured keys: no key or an unknown one is
no role (Role.NONE), and without keys everyone has the role Python hands over."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from feature_store import _native
from feature_store.serving.auth import Authenticator, Role

KEY = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12)
HEADER_CHARS = st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.just("\t")


@st.composite
def headers(draw: st.DrawFn, keys: list[str]) -> str | None:
    """A header that is often, but not always, one of the keys under some scheme."""
    kind = draw(st.sampled_from(["key", "text", "none"]))
    if kind == "none":
        return draw(st.sampled_from([None, ""]))
    if kind == "text" or not keys:
        return draw(st.text(HEADER_CHARS, max_size=30))
    scheme = draw(st.sampled_from(["Bearer", "bearer", "BEARER", "Basic", "Bearer\t", "Bear"]))
    pad = draw(st.sampled_from(["", " ", "  ", "\t"]))
    return f"{scheme} {pad}{draw(st.sampled_from(keys))}{pad}"


@given(st.lists(KEY, max_size=3), st.lists(KEY, max_size=3), st.data())
@example(["reader-key"], ["admin-key"], None)
def test_the_native_key_check_grants_what_the_reference_grants(
    read: list[str], admin: list[str], data: st.DataObject | None
) -> None:
    auth = Authenticator(tuple(read), tuple(admin))
    keys, everyone = auth.native()
    samples = [None, "Bearer reader-key", "Bearer admin-key", "Bearer  admin-key "]
    if data is not None:
        samples += [data.draw(headers(read + admin)) for _ in range(5)]
    for header in samples:
        native = _native.key_role(keys, everyone, header)
        assert Role(native if native is not None else Role.NONE) is auth.role(header), header
