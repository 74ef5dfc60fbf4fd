"""The operator console in a real browser: Debian's Chromium, driven by selenium through chromedriver,
against a real gateway in front of a fake upstream. Screenshots of every page go to build/ui-screenshots/."""

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from tests.conftest import gateway_settings
from tests.fakes import FakeUpstream, ServerThread
from tests.ui_browser_support import chromium_or_skip, screenshot, wait_for

ADMIN_TOKEN = "adm-console-test-token"
XSS_NAME = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    browser = chromium_or_skip()
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture(scope="module")
def gateway() -> Iterator[ServerThread]:
    with ServerThread(FakeUpstream()) as upstream:
        settings = gateway_settings(upstream.url, admin_token=ADMIN_TOKEN)
        with ServerThread(create_app(settings)) as server:
            yield server


def by_css(driver: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def all_css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def open_page(driver: Any, base: str, page: str) -> None:
    if driver.execute_script("return document.getElementById('page').dataset.page") == page:
        driver.refresh()
    else:
        driver.get(f"{base}/ui/#/{page}")

    def ready() -> bool:
        root = by_css(driver, "#page")
        return root.get_attribute("data-page") == page and root.get_attribute("data-ready") == "true"

    wait_for(ready, what=f"the {page} page")
    errors = [e.text for e in all_css(driver, "#page [role=alert].error, #page p.error") if e.text]
    assert not errors, errors


def fill(driver: Any, selector: str, text: str) -> None:
    element = by_css(driver, selector)
    element.clear()
    element.send_keys(text)


def choose(driver: Any, selector: str, visible_text: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(by_css(driver, selector)).select_by_visible_text(visible_text)


def accept_confirm(driver: Any) -> None:
    wait_for(lambda: driver.switch_to.alert, what="the confirmation").accept()


def admin_api(gateway: ServerThread) -> httpx.Client:
    return httpx.Client(
        base_url=gateway.url + "/admin/v1", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}
    )


def sign_in(driver: Any, base: str) -> None:
    driver.get(base + "/ui/")
    wait_for(lambda: by_css(driver, "#token").is_displayed(), what="the sign-in form")
    fill(driver, "#token", "not-the-token")
    by_css(driver, "#sign-in-form button").click()
    wait_for(lambda: "not the admin token" in by_css(driver, "#sign-in-error").text, what="the refusal")
    screenshot(driver, "00-sign-in")
    fill(driver, "#token", ADMIN_TOKEN)
    by_css(driver, "#sign-in-form button").click()
    wait_for(lambda: by_css(driver, "#page").get_attribute("data-ready") == "true", what="the overview")
    assert ADMIN_TOKEN not in driver.current_url
    cookie = driver.get_cookie("llmgw_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and ADMIN_TOKEN not in cookie["value"]
    assert driver.execute_script("return document.cookie") == ""  # HttpOnly: script cannot read it


def create_policy(driver: Any, base: str) -> None:
    open_page(driver, base, "policies")
    fill(driver, "#name", "starter")
    fill(driver, "#allowed_models", "fake-model")
    fill(driver, "#key_limits-rpm", "-5")
    by_css(driver, "#policy-form button[type=submit]").click()
    wait_for(lambda: "key_limits.rpm" in by_css(driver, "#policy-problems").text, what="the schema's refusal")
    assert by_css(driver, "#key_limits-rpm").get_attribute("aria-invalid") == "true"
    fill(driver, "#key_limits-rpm", "60")
    fill(driver, "#tenant_budget-usd_per_day", "5")
    by_css(driver, "#policy-form button[type=submit]").click()
    diff = wait_for(lambda: by_css(driver, "#policy-diff").text, what="the diff")
    added = [line for line in diff.splitlines() if line.startswith("+")]
    assert any('"rpm": 60' in line for line in added) and any('"usd_per_day": 5' in line for line in added)
    screenshot(driver, "03-policies-diff")
    by_css(driver, "#policy-save").click()
    wait_for(lambda: by_css(driver, "#policy-pick option:checked").text == "starter", what="the saved policy")


def create_tenant_and_key(driver: Any, base: str) -> str:
    open_page(driver, base, "tenants")
    fill(driver, "#tenant-id", "acme")
    fill(driver, "#tenant-name", XSS_NAME)
    choose(driver, "#tenant-policy", "starter")
    by_css(driver, "#create-tenant button").click()
    wait_for(lambda: all_css(driver, "#keys-panel"), what="the tenant's keys")
    cell = by_css(driver, "#tenants-table tr[data-tenant=acme] td[data-col=name]")
    assert cell.text == XSS_NAME  # the markup shows as text
    assert not all_css(driver, "#page img")  # and made no element
    fill(driver, "#key-name", "laptop")
    by_css(driver, "#create-key button").click()
    secret = wait_for(lambda: by_css(driver, "#new-key-secret").text, what="the new key")
    assert secret.startswith("sk-")
    screenshot(driver, "02-tenants-keys")
    return secret


def test_console_end_to_end(driver: Any, gateway: ServerThread) -> None:
    base = gateway.url
    sign_in(driver, base)
    create_policy(driver, base)
    secret = create_tenant_and_key(driver, base)

    sdk = openai.OpenAI(base_url=base + "/v1", api_key=secret, max_retries=0)
    answer = sdk.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "echo: hi"
    api = admin_api(gateway)
    wait_for(lambda: api.get("/usage", params={"tenant_id": "acme"}).json()["data"], what="the usage record")

    open_page(driver, base, "overview")
    assert_overview_matches_api(driver, api)
    screenshot(driver, "01-overview")

    open_page(driver, base, "usage")
    row = by_css(driver, "#usage-table tr[data-group=fake-model]")
    assert row.find_elements("css selector", "td")[1].text == "1"
    assert all_css(driver, "#usage-chart svg circle")  # a point drawn for the request
    screenshot(driver, "05-usage")

    open_page(driver, base, "models")
    assert "fake-1" in by_css(driver, "#page").text
    screenshot(driver, "04-models")

    open_page(driver, base, "caches")
    choose(driver, "#flush-tenant", f"acme — {XSS_NAME}")
    by_css(driver, "#cache-flush button").click()
    accept_confirm(driver)
    wait_for(lambda: "Flushed" in by_css(driver, "#flush-result").text, what="the flush")
    screenshot(driver, "06-caches")

    open_page(driver, base, "tenants")
    by_css(driver, "#tenants-table tr[data-tenant=acme] button").click()
    wait_for(lambda: all_css(driver, "#keys-table button.danger"), what="the key's revoke button")
    by_css(driver, "#keys-table button.danger").click()
    accept_confirm(driver)
    wait_for(
        lambda: by_css(driver, "#keys-table td[data-col=state]").text.startswith("revoked"), what="revoked"
    )
    with pytest.raises(openai.AuthenticationError):
        sdk.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "again"}])

    driver.set_window_size(390, 844)  # a phone: the page reflows, nothing needs sideways scrolling but tables
    open_page(driver, base, "overview")
    width = driver.execute_script("return document.documentElement.scrollWidth")
    assert width <= 400, width
    screenshot(driver, "07-overview-phone")
    driver.set_window_size(1280, 800)

    by_css(driver, "#sign-out").click()
    wait_for(lambda: by_css(driver, "#token").is_displayed(), what="the sign-in form again")
    assert driver.get_cookie("llmgw_console") is None


def assert_overview_matches_api(driver: Any, api: httpx.Client) -> None:
    """Every number the overview shows is the admin API's for the same window."""
    root = by_css(driver, "#overview")
    window = {"start": root.get_attribute("data-start"), "end": root.get_attribute("data-end")}
    overview = api.get("/overview", params=window).json()
    usage = api.get("/usage", params={**window, "group_by": "model"}).json()["data"]
    shown = {e.get_attribute("data-figure"): e for e in all_css(driver, "#overview dd[data-figure]")}
    totals = overview["totals"]
    for name, value in totals.items():
        if name in shown:
            assert float(shown[name].get_attribute("data-value")) == pytest.approx(value, rel=1e-12), name
    assert float(shown["requests"].get_attribute("data-value")) == sum(r["requests"] for r in usage) >= 1
    assert shown["requests"].text == f"{totals['requests']:,}"
    assert shown["cost_usd"].text == f"${totals['cost_usd']:.6f}"
    assert float(shown["cost_usd"].get_attribute("data-value")) == pytest.approx(
        sum(r["cost_usd"] for r in usage)
    )
    tokens = sum(r["prompt_tokens"] for r in usage), sum(r["completion_tokens"] for r in usage)
    assert (totals["prompt_tokens"], totals["completion_tokens"]) == tokens
    for model in overview["models"]:
        row = by_css(driver, f"#overview-models tr[data-model='{model['model']}']")
        cells = {c.get_attribute("data-col"): c.text for c in row.find_elements("css selector", "td")}
        assert cells["requests"] == f"{model['requests']:,}"
        assert cells["cost_usd"] == f"${model['cost_usd']:.6f}"
        assert cells["p95_latency_ms"] == f"{model['p95_latency_ms']:.1f} ms"


def test_keyboard_reaches_every_page(driver: Any, gateway: ServerThread) -> None:
    from selenium.webdriver.common.keys import Keys

    driver.get(gateway.url + "/ui/")
    if by_css(driver, "#token").is_displayed():
        fill(driver, "#token", ADMIN_TOKEN + Keys.ENTER)  # Enter submits the labelled form
    wait_for(lambda: by_css(driver, "#page").get_attribute("data-ready") == "true", what="a page")
    from selenium.webdriver.common.action_chains import ActionChains

    driver.refresh()  # a fresh document: the first Tab starts at its top
    wait_for(lambda: by_css(driver, "#page").get_attribute("data-ready") == "true", what="the page again")
    ActionChains(driver).send_keys(Keys.TAB).perform()  # from the top of the document
    assert driver.switch_to.active_element.text == "Skip to content"
    for label in ("Overview", "Tenants and keys", "Policies", "Models and routing", "Usage", "Caches"):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        assert driver.switch_to.active_element.text == label
    ActionChains(driver).send_keys(Keys.ENTER).perform()  # follows the focused link
    wait_for(lambda: by_css(driver, "#page").get_attribute("data-page") == "caches", what="the caches page")
    unlabelled = driver.execute_script(
        "return [...document.querySelectorAll('input, select, textarea')].filter(e => e.type !== 'hidden'"
        " && !e.labels.length && !e.getAttribute('aria-label')).map(e => e.outerHTML)"
    )
    assert unlabelled == []


def test_a_read_only_token_gets_no_enabled_action(driver: Any, gateway: ServerThread) -> None:
    """An admin token with scope read signs in to a console whose every change is disabled (and refused)."""
    made = admin_api(gateway).post("/admin-tokens", json={"name": "viewer", "scope": "read"}).json()
    driver.get(gateway.url + "/ui/")
    driver.delete_all_cookies()
    driver.get(gateway.url + "/ui/")
    wait_for(lambda: by_css(driver, "#token").is_displayed(), what="the sign-in form")
    fill(driver, "#token", made["token"])
    by_css(driver, "#sign-in-form button").click()
    wait_for(lambda: by_css(driver, "#page").get_attribute("data-ready") == "true", what="the overview")
    assert by_css(driver, "#read-only").is_displayed()
    for page, selector in (("tenants", "#create-tenant button"), ("tenants", "#create-tenant input"),
                           ("policies", "#policy-form button[type=submit]"), ("caches", "#cache-flush button")):  # fmt: skip
        open_page(driver, gateway.url, page)
        assert not by_css(driver, selector).is_enabled(), (page, selector)
    open_page(driver, gateway.url, "tenants")
    controls = "#page button[data-writes], #page [data-writes] button, #page [data-writes] input, #page [data-writes] select"
    enabled = [b.get_attribute("outerHTML") for b in all_css(driver, controls) if b.is_enabled()]
    assert enabled == []
    screenshot(driver, "08-read-only")
    driver.delete_all_cookies()
