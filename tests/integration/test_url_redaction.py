"""A store URL is shown (banners, errors) without its password, in the authority or as a
libpq option (``store.open.redact``)."""

from __future__ import annotations

import pytest

import taskward
from taskward.errors import StoreError
from taskward.store.open import redact
from tests.conftest import PG_URL


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pw@h/db", "postgresql://u:***@h/db"),
        (
            "postgresql://u@h/db?password=s3cret&pool_max=3",
            "postgresql://u@h/db?password=***&pool_max=3",
        ),
        ("postgresql://u@h/db?sslpassword=x", "postgresql://u@h/db?sslpassword=***"),
        ("postgresql://u@h/db?pool_max=3", "postgresql://u@h/db?pool_max=3"),
        ("sqlite:///x.db", "sqlite:///x.db"),
    ],
)
def test_a_shown_url_never_carries_a_password(url: str, shown: str) -> None:
    assert redact(url) == shown


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
async def test_a_refused_connection_names_the_url_without_its_password(backend: str) -> None:
    base = PG_URL.rsplit("/", 1)[0]
    url = f"{base}/taskward_no_such_db?password=s3cret-value&open_timeout_s=5&migrate=false"
    with pytest.raises(StoreError) as refused:
        await taskward.open_db(url)
    assert "taskward_no_such_db" in str(refused.value)
    assert "s3cret-value" not in str(refused.value)
