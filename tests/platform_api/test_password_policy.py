"""New passwords (NIST SP 800-63B 5.1.1.2): long enough, not among the common and
breached ones, not made of the account's own e-mail address, names or the service's
name; no composition rules."""

from __future__ import annotations

import httpx
import pytest

from platform_api.auth.password_policy import check_new_password, common_passwords
from platform_api.envelope import ApiError

CONTEXT = ["amina.odhiambo@kenyatta-hospital.example", "Amina", "Odhiambo", "healthplatform"]


@pytest.mark.parametrize("weak", ["password", "12345678", "Password1", "PASSWORD1",
                                  "qwertyuiop", "iloveyou", "sunshine"])
def test_common_and_breached_passwords_are_refused_whatever_their_case(weak: str) -> None:
    with pytest.raises(ApiError) as refused:
        check_new_password(weak, CONTEXT)
    assert (refused.value.status, refused.value.field) == (422, "password")
    assert "breached" in refused.value.message


@pytest.mark.parametrize("close", ["Odhiambo1", "odhiambo2024", "amina.odhiambo",
                                   "healthplatform!", "AMINA.Odhiambo1"])
def test_passwords_made_of_the_context_are_refused(close: str) -> None:
    with pytest.raises(ApiError, match="too close"):
        check_new_password(close, CONTEXT)


@pytest.mark.parametrize("good", ["correct horse battery", "Kilimanjaro-2026",
                                  "mvua ya masika inanyesha", "tn8#Lq2!"])
def test_long_or_uncommon_passwords_pass_without_composition_rules(good: str) -> None:
    assert check_new_password(good, CONTEXT) == good


def test_the_shipped_list_is_loaded_lower_case_and_of_passwords_long_enough() -> None:
    common = common_passwords()
    assert len(common) > 8000
    assert all(p == p.lower() and len(p) >= 8 for p in common)


async def test_registration_and_reset_refuse_a_weak_password_naming_the_field(
        client: httpx.AsyncClient) -> None:
    response = await client.post("/api/auth/register", json={
        "email": "kwame.mensah@korlebu.example", "password": "Password1",
        "first_name": "Kwame", "last_name": "Mensah"})
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "password"
    reset = await client.post("/api/auth/reset-password",
                              json={"token": "pr_whatever", "password": "12345678"})
    assert reset.status_code == 422 and reset.json()["error"]["field"] == "password"
