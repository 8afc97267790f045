"""Connection strings in messages: the password never shows, whatever form the DSN takes."""

from __future__ import annotations

import socket

import pytest

from conductor_engine.engine.storage.database import DatabaseError, connect_pool, redact_url
from conductor_engine.engine.storage.postgres_server import scram_verifier


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://postgres:s3cret@/postgres?host=/data/postgres",
     "postgresql://postgres:***@/postgres?host=/data/postgres"),
    ("postgresql://u:p%40ss%3Aw@db:5432/conductor", "postgresql://u:***@db:5432/conductor"),
    ("postgresql://u:s3cret@@db:5432/c", "postgresql://u:***@db:5432/c"),
    ("postgres://u@db/c?sslmode=require&password=s3cret",
     "postgres://u@db/c?sslmode=require&password=***"),
    ("postgres://u@db/c?sslpassword=s3cret&sslmode=verify-full",
     "postgres://u@db/c?sslpassword=***&sslmode=verify-full"),
    ("host=db user=u password=s3cret dbname=c", "host=db user=u password=*** dbname=c"),
    ("host=db password='s3 cret' dbname=c", "host=db password=*** dbname=c"),
    ("postgresql://u@db/c", "postgresql://u@db/c"),
])
def test_redact_url_hides_the_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "cret" not in redact_url(url) and "p%40ss" not in redact_url(url)


async def test_an_unreachable_database_is_named_without_its_password() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    with pytest.raises(DatabaseError) as caught:
        await connect_pool(f"postgresql://conductor:hunter2-s3cret@127.0.0.1:{port}/c")
    assert "hunter2" not in str(caught.value)
    assert f"postgresql://conductor:***@127.0.0.1:{port}/c" in str(caught.value)


def test_the_scram_verifier_checks_rfc_7677_s_exchange() -> None:
    """RFC 7677's example (user "user", password "pencil", its salt, 4096 rounds): a server
    holding our verifier accepts the client's proof and answers with the RFC's signature."""
    import base64
    import hashlib
    import hmac

    verifier = scram_verifier("pencil", salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))
    head, keys = verifier.split("$", 1)[1].split("$")
    assert head == "4096:W22ZaJ0SNY7soEsUEjb6gQ=="
    stored_key, server_key = (base64.b64decode(k) for k in keys.split(":"))
    nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    auth = (f"n=user,r=rOprNGfwEbeRWgbNEkqO,r={nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,"
            f"c=biws,r={nonce}").encode()
    proof = base64.b64decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    client_key = bytes(a ^ b for a, b in zip(
        proof, hmac.digest(stored_key, auth, "sha256"), strict=True))
    assert hashlib.sha256(client_key).digest() == stored_key
    assert base64.b64encode(hmac.digest(server_key, auth, "sha256")).decode() == (
        "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
