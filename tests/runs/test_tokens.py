"""API tokens' pure rules (workbench.runs.tokens): secret shape, hash-only storage, bounds, and why
a token cannot act. The table itself is checked by test_migrations (schema == migrated head)."""

from __future__ import annotations

import pytest

from workbench.runs import tokens


def test_a_secret_is_random_prefixed_and_only_its_hash_matches():
    first, second = tokens.new_secret(), tokens.new_secret()
    assert first != second and first.startswith("wb_") and len(first) >= 46
    stored = tokens.secret_hash(first)
    assert first not in stored and len(stored) == 64
    assert tokens.secret_matches(first, stored)
    assert not tokens.secret_matches(second, stored)
    assert tokens.checked_secret_shape(f"  {first}\n") == first


@pytest.mark.parametrize("bad", [0, 366, 1.5, float("nan"), float("inf"), True, "30"])
def test_days_outside_1_to_365_are_refused_naming_the_field(bad):
    with pytest.raises(tokens.TokenError, match=r"days=.*1 to 365"):
        tokens.checked_days(bad)


def test_days_inside_the_bounds_are_kept():
    assert [tokens.checked_days(d) for d in (1, 30, 365, 30.0)] == [1, 30, 365, 30]


@pytest.mark.parametrize("bad", ["", "ghp_abc", "wb_short"])
def test_a_value_that_is_not_a_token_names_the_env_variable(bad):
    with pytest.raises(tokens.TokenError, match="WORKBENCH_TOKEN"):
        tokens.checked_secret_shape(bad)


def _record(**changes):
    fields = dict(id="abc123def456", secret_sha256="0" * 64, user_name="ada@example.org", role="member",
                  label="laptop", created_by="admin", created_at=0.0, expires_at=100.0)
    return tokens.TokenRecord(**{**fields, **changes})


def test_unknown_revoked_and_expired_tokens_say_why():
    assert tokens.unusable_reason(None, 1.0) == "WORKBENCH_TOKEN is not a known token"
    assert "revoked" in tokens.unusable_reason(_record(revoked_at=5.0), 10.0)
    assert "expired" in tokens.unusable_reason(_record(), 100.0)
    assert tokens.unusable_reason(_record(), 99.0) is None


def test_the_store_keeps_only_the_hash_and_revokes_once(store_location):
    """On real SQLite and the real PostgreSQL fixture: the secret is nowhere in the table's rows."""
    import sqlalchemy as sa
    from workbench.runs.schema import api_tokens
    from workbench.runs.store import RunStore

    store = RunStore(store_location)
    secret = tokens.new_secret()
    record = _record(id=tokens.new_token_id(), secret_sha256=tokens.secret_hash(secret), expires_at=1e12)
    store.add_token(record)
    with store._read() as conn:
        rows = [tuple(map(str, row)) for row in conn.execute(sa.select(api_tokens))]
    assert rows and not any(secret in cell for row in rows for cell in row)
    assert store.token_by_hash(tokens.secret_hash(secret)) == record
    assert store.token_by_hash(tokens.secret_hash(tokens.new_secret())) is None
    assert store.set_token_time(record.id, "revoked_at", 5.0)
    assert not store.set_token_time(record.id, "revoked_at", 6.0)  # revoking twice changes nothing
    assert "revoked" in tokens.unusable_reason(store.token_by_hash(record.secret_sha256), 7.0)
    assert [t.id for t in store.tokens()] == [record.id]
