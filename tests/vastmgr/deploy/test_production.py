"""The production deployment of docs/deployment.md, "Production deployment", run as documented: the shipped
systemd units' commands and environment file, PostgreSQL and Redis, and Debian's nginx with the
shipped site file (only ports, paths and the certificate substituted) in front of daphne over
TLS. Through it, Debian's chromium logs in, watches a live panel over wss, posts an htmx form
with its CSRF token, loads a static file that nginx serves, and adds a notification channel
whose deliveries the real notifier process retries through a receiver's outage. Debian's
Prometheus scrapes the dashboard's /metrics and the engine's metrics relayed by the controller,
and its HTTP API must return the expected series with the values the database holds."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO, eventually, free_port, wait_for_http
from tests.vastmgr import live_engine
from tests.vastmgr.notify.receiver import Receiver
from tests.vastmgr.served.test_scaleout import (
    DATABASE_URL,
    REDIS_URL,
    Process,
    any_exited,
    fresh_database,
    query,
    start_process,
)

param_cache = live_engine.param_cache

DEPLOY = REPO / "deploy"
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
PROMETHEUS = shutil.which("prometheus")
USER, PASSWORD = "ops", "pw-for-production-1"
START_TIMEOUT = 120
PROOFS = 3
# A Redis database of its own, so that another suite's groups never see these pushes.
REDIS_DB = 11
SCREENSHOTS = REPO / "test-output" / "production"

pytestmark = [
    pytest.mark.browser, pytest.mark.scaleout,
    pytest.mark.skipif(not (DATABASE_URL and REDIS_URL),
                       reason="TEST_DATABASE_URL and TEST_REDIS_URL are unset (.ci/run starts "
                              "PostgreSQL and Redis and exports them)"),
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"no chromium at {CHROMIUM}"),
    pytest.mark.skipif(not os.access(NGINX, os.X_OK), reason="Debian's nginx is not installed"),
    pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not installed"),
]


def service_settings(name: str) -> dict[str, list[str]]:
    """The [Service] settings of a shipped unit, each with every value it is given (systemd
    units repeat keys such as ExecStartPre, which configparser would collapse)."""
    settings: dict[str, list[str]] = {}
    section = None
    for line in (DEPLOY / "systemd" / name).read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def unit_commands(name: str, key: str, venv_bin: str | None = None) -> list[list[str]]:
    """A unit's ExecStart (or ExecStartPre) lines, with the documented install paths replaced
    by this checkout's: /opt/vastmgr is the repository, /opt/vastmgr/venv its virtualenv
    (`venv_bin`, this interpreter's by default)."""
    service = service_settings(name)
    assert service["WorkingDirectory"] == ["/opt/vastmgr"]
    venv_bin = venv_bin or str(Path(sys.executable).parent)
    return [[word.replace("/opt/vastmgr/venv/bin", venv_bin) for word in shlex.split(line)]
            for line in service.get(key, [])]


def environment(**values: str) -> dict[str, str]:
    """deploy/vastmgr.env.example with every variable it sets replaced by `values` (all of
    them must be: the example's placeholders never reach a process)."""
    example = {}
    for line in (DEPLOY / "vastmgr.env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            example[key] = value
    assert set(example) <= set(values), set(example) - set(values)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VASTMGR_", "CUZK_")) and k not in {
               "DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS",
               "CSRF_TRUSTED_ORIGINS"}}
    return {**env, **values, "PYTHONPATH": str(REPO)}


def nginx_config(workdir: Path, https_port: int, http_port: int, dashboard_port: int,
                 static_root: Path) -> Path:
    """The shipped site, with the ports, the certificate and the static root of this test,
    inside a minimal main configuration (Debian's /etc/nginx/nginx.conf plays that part)."""
    cert, key = workdir / "fullchain.pem", workdir / "privkey.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    site = (DEPLOY / "nginx" / "vastmgr.conf").read_text()
    substitutions = [
        ("server 127.0.0.1:8000;", f"server 127.0.0.1:{dashboard_port};"),
        ("listen 443 ssl http2;", f"listen 127.0.0.1:{https_port} ssl http2;"),
        ("listen 80;", f"listen 127.0.0.1:{http_port};"),
        ("/etc/ssl/vastmgr/fullchain.pem", str(cert)),
        ("/etc/ssl/vastmgr/privkey.pem", str(key)),
        ("/var/lib/vastmgr/data/static/", f"{static_root}/"),
        ("vastmgr.example.com", "127.0.0.1"),
    ]
    for old, new in substitutions:
        assert old in site, f"the site file no longer has {old!r}"
        site = site.replace(old, new)
    # This machine may have no IPv6: the site's [::] listeners are left out.
    site = "\n".join(line for line in site.splitlines() if "listen [::]" not in line)
    (workdir / "site.conf").write_text(site)
    main = workdir / "nginx.conf"
    main.write_text(f"""
{"user root;" if os.geteuid() == 0 else ""}
worker_processes 1;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{ worker_connections 256; }}
http {{
    include /etc/nginx/mime.types;
    access_log {workdir}/nginx-access.log;
    client_body_temp_path {workdir}/client_body;
    proxy_temp_path {workdir}/proxy;
    fastcgi_temp_path {workdir}/fastcgi;
    uwsgi_temp_path {workdir}/uwsgi;
    scgi_temp_path {workdir}/scgi;
    include {workdir}/site.conf;
}}
""")
    return main


def prometheus_config(workdir: Path, base: str, token: str, engine_port: int) -> Path:
    """deploy/prometheus/vastmgr-scrape.yml with this test's target, token file, rules path and
    certificate (self-signed here, so not verified), scraping every second, and one more job:
    the engine itself on loopback, to compare with what the relay serves."""
    import yaml

    config = yaml.safe_load((DEPLOY / "prometheus" / "vastmgr-scrape.yml").read_text())
    (workdir / "vastmgr-token").write_text(token)
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    assert config["rule_files"] == ["vastmgr-rules.yml"]
    config["rule_files"] = [str(DEPLOY / "prometheus" / "vastmgr-rules.yml")]
    jobs = config["scrape_configs"]
    assert [job["job_name"] for job in jobs] == ["vastmgr", "vastmgr-engines"]
    for job in jobs:
        assert job["authorization"] == {"credentials_file": "/etc/prometheus/vastmgr-token"}
        job["authorization"]["credentials_file"] = str(workdir / "vastmgr-token")
        job["static_configs"] = [{"targets": [base.removeprefix("https://")]}]
        job["tls_config"] = {"insecure_skip_verify": True}
    jobs.append({"job_name": "engine-direct",
                 "static_configs": [{"targets": [f"127.0.0.1:{engine_port}"]}]})
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def promql(prometheus: str, expr: str) -> list[dict]:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as response:
        answer = json.load(response)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def single_value(prometheus: str, expr: str) -> float | None:
    result = promql(prometheus, expr)
    return float(result[0]["value"][1]) if len(result) == 1 else None


@pytest.fixture(scope="module")
def deployment(param_cache, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("production")
    data = workdir / "data"
    token = secrets.token_urlsafe(24)
    https_port, http_port, dashboard_port, engine_port, prom_port = (free_port()
                                                                     for _ in range(5))
    base = f"https://127.0.0.1:{https_port}"
    machine_name = f"prod-{secrets.token_hex(3)}"
    processes: list[Process] = []
    with fresh_database() as database_url, Receiver() as receiver:
        env = environment(
            SECRET_KEY=secrets.token_urlsafe(50), DATABASE_URL=database_url,
            REDIS_URL=REDIS_URL.rsplit("/", 1)[0] + f"/{REDIS_DB}",
            ALLOWED_HOSTS="127.0.0.1", VASTMGR_HTTPS="1", VASTMGR_DATA_DIR=str(data),
            VASTMGR_METRICS_TOKEN=token, VASTMGR_METRICS_RELAY_INTERVAL_S="1",
            VASTMGR_NOTIFY_BACKOFF_S="0.3", CUZK_PARAM_CACHE=str(param_cache),
            DJANGO_SUPERUSER_PASSWORD=PASSWORD)
        for argv in [*unit_commands("vastmgr-dashboard.service", "ExecStartPre"),
                     [sys.executable, "manage.py", "createsuperuser", "--noinput",
                      "--username", USER, "--email", "ops@example.com"]]:
            done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                                  check=False)
            assert done.returncode == 0, f"{argv}:\n{done.stdout}{done.stderr}"
        [dashboard] = unit_commands("vastmgr-dashboard.service", "ExecStart")
        dashboard[dashboard.index("8000")] = str(dashboard_port)
        commands = [("engine", [sys.executable, "manage.py", "run_engine", "--listen",
                                f"127.0.0.1:{engine_port}", "--name", machine_name]),
                    ("dashboard", dashboard)]
        commands += [(name, unit_commands(f"vastmgr-{name}.service", "ExecStart")[0])
                     for name in ("controller", "automation", "notifier")]
        try:
            for name, argv in commands:
                processes.append(start_process(name, argv, env, workdir))
            died = any_exited(processes)
            wait_for_http(f"http://127.0.0.1:{engine_port}/status", START_TIMEOUT, died)
            # Daphne redirects plain http to https (VASTMGR_HTTPS): its port opening is the sign.
            eventually(lambda: died() or port_open(dashboard_port), START_TIMEOUT,
                       "daphne listens")
            assert not died(), died()
            conf = nginx_config(workdir, https_port, http_port, dashboard_port, data / "static")
            processes.append(start_process(
                "nginx", [NGINX, "-c", str(conf), "-p", str(workdir), "-g", "daemon off;"],
                env, workdir))
            processes.append(start_process("prometheus", [
                PROMETHEUS, f"--config.file={prometheus_config(workdir, base, token, engine_port)}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"], env, workdir))
            eventually(lambda: curl(base + "/accounts/login/").returncode == 0, 30,
                       "nginx answers over TLS", lambda: (workdir / "nginx-error.log").read_text())
            [(machine_id,)] = query(database_url, "SELECT id FROM fleet_machine WHERE name = %s",
                                    machine_name)
            yield {"base": base, "env": env, "machine_id": machine_id, "name": machine_name,
                   "database_url": database_url, "receiver": receiver, "token": token,
                   "prometheus": f"http://127.0.0.1:{prom_port}", "engine_port": engine_port,
                   "http_port": http_port, "workdir": workdir,
                   "processes": {p.name: p for p in processes}}
        finally:
            for p in reversed(processes):
                p.stop()
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            for p in processes:
                (SCREENSHOTS / f"{p.name}.log").write_text(p.output())


def screenshot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def curl(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["curl", "-sk", "--max-time", "10", *args, url],
                          capture_output=True, text=True, check=False)


def test_check_deploy_is_clean_with_the_production_settings(deployment):
    done = subprocess.run([sys.executable, "manage.py", "check", "--deploy",
                           "--fail-level", "WARNING"], cwd=REPO, env=deployment["env"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


def test_nginx_speaks_http2_redirects_plain_http_and_serves_static_files(deployment):
    base = deployment["base"]
    head = curl(base + "/static/vastmgr/app.css", "--http2", "-o", "/dev/null", "-D", "-",
                "-w", "%{http_version}")
    assert head.stdout.startswith("HTTP/2 200"), head.stdout
    headers = head.stdout.lower()
    assert "cache-control: public" in headers and "expires:" in headers  # nginx's, not daphne's
    assert "server: nginx" in headers
    assert (REPO / "static" / "vastmgr" / "app.css").read_text() == curl(
        base + "/static/vastmgr/app.css").stdout
    plain = curl(f"http://127.0.0.1:{deployment['http_port']}/", "-o", "/dev/null",
                 "-w", "%{http_code} %{redirect_url}")
    assert plain.stdout.startswith("301 https://127.0.0.1"), plain.stdout
    # Secure cookies and HSTS from Django behind the proxy.
    login = curl(base + "/accounts/login/", "-D", "-", "-o", "/dev/null").stdout.lower()
    assert "strict-transport-security: max-age=31536000" in login
    assert re.search(r"set-cookie: csrftoken=[^\n]*; secure", login), login
    # Metrics: the token opens them, nothing else does through the proxy.
    assert curl(base + "/metrics", "-o", "/dev/null", "-w", "%{http_code}").stdout == "403"
    ok = curl(base + "/metrics", "-H", f"Authorization: Bearer {deployment['token']}")
    assert "vastmgr_hosts{" in ok.stdout
    # The body limit: nginx refuses a 2 MB post before it reaches daphne.
    body = Path(deployment["workdir"]) / "big-body"
    body.write_bytes(b"x" * 2_000_000)
    big = curl(base + "/accounts/login/", "-o", "/dev/null", "-w", "%{http_code}",
               "--data-binary", f"@{body}", "-H", "Content-Type: application/octet-stream")
    assert big.stdout == "413"


def test_the_browser_through_nginx_over_tls(deployment, browser_page):
    page, sockets = browser_page
    base, name = deployment["base"], deployment["name"]
    receiver: Receiver = deployment["receiver"]

    # Log in (a form POST with its CSRF token, over https).
    page.goto(f"{base}/accounts/login/")
    page.fill("#id_username", USER)
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base}/")
    page.wait_for_function("document.getElementById('connection-badge').textContent === 'live'")
    assert any(url.startswith(f"wss://127.0.0.1:{base.rsplit(':', 1)[1]}/ws/fleet/")
               for url in sockets), sockets
    token = page.evaluate("window.__token = Math.random().toString(36)")
    row = page.locator("#fleet-rows tr", has_text=name)
    row.wait_for()

    # Proofs started from the form in a second tab (a POST with its CSRF token) change this
    # page's fleet row by pushes over wss: it is never reloaded.
    form = page.context.new_page()
    form.goto(f"{base}/proofs/new/")
    form.select_option("#id_machine", label=name)
    form.select_option("#id_kind", "winning-post")
    form.select_option("#id_profile", "tiny")
    form.fill("#id_seed", "1")
    form.fill("#id_count", str(PROOFS))
    form.locator("form.proof-form").get_by_role("button", name="Start").click()
    form.wait_for_url(f"{base}/proofs/*")
    form.close()
    row.locator(".ok", has_text=str(PROOFS)).wait_for(timeout=120_000)
    assert page.evaluate("window.__token") == token, "the fleet page was reloaded"
    screenshot(page, "fleet")

    # A notification channel added through the page; its test button is an htmx POST that
    # carries the CSRF token from the page.
    page.goto(f"{base}/notify/")
    page.fill("#id_name", "team")
    page.fill("#id_url", receiver.url)
    page.select_option("#id_min_level", "info")
    page.check("input[name=topics][value=srs]")
    page.fill("#id_resend_minutes", "60")
    page.get_by_role("button", name="Add channel").click()
    page.wait_for_url(f"{base}/notify/")
    posts: list[dict] = []
    page.on("request", lambda r: posts.append({"url": r.url, "headers": r.headers})
            if r.method == "POST" else None)
    page.get_by_role("button", name="Send test notification").click()
    page.get_by_text("sent to team").wait_for(timeout=20_000)
    screenshot(page, "notifications")
    [test_post] = [p for p in posts if p["url"].endswith("/test/")]
    assert test_post["headers"].get("hx-request") == "true"
    assert test_post["headers"].get("x-csrftoken")
    assert receiver.messages()[-1].startswith("A test from vastmgr")

    # An SRS preload from the host page becomes an Event; the notifier process delivers it
    # through the receiver's outage, once.
    receiver.fail_next = 2
    page.goto(f"{base}/machines/{deployment['machine_id']}/")
    page.fill("#host-srs-form input[name=circuit_id]", "winning-post.tiny")
    page.locator("#host-srs-form").get_by_role("button", name=re.compile("Preload")).click()
    eventually(lambda: any("SRS winning-post.tiny preloaded" in m for m in receiver.messages()),
               60, "the preload's Event reached the receiver",
               lambda: deployment["processes"]["notifier"].output()[-2000:])
    # One delivery, sent on its third attempt: nothing is left to retry, so nothing can repeat.
    eventually(lambda: query(deployment["database_url"],
                             "SELECT d.state, d.attempts FROM notify_delivery d JOIN fleet_event e"
                             " ON d.event_id = e.id WHERE e.kind = 'srs'") == [("sent", 3)],
               10, "the delivery recorded as sent on its third attempt")
    assert receiver.refused == 2
    assert sum("SRS winning-post.tiny" in m for m in receiver.messages()) == 1


def test_prometheus_finds_the_fleet_and_the_relayed_engine(deployment):
    """Runs after the browser test's proofs: three winning-post proofs done on the engine."""
    assert query(deployment["database_url"], "SELECT count(*) FROM proofs_proofjob WHERE "
                 "status = 'done'") == [(PROOFS,)]
    prometheus, name = deployment["prometheus"], deployment["name"]
    direct = 'cuzk_proofs_completed_total{job="engine-direct", proof_kind="winning_post"}'
    eventually(lambda: single_value(prometheus, direct) == PROOFS, 60,
               "Prometheus scraped the engine directly")

    def relayed() -> float | None:
        return single_value(prometheus, f'cuzk_proofs_completed_total{{job="vastmgr-engines", '
                                        f'host="{name}", proof_kind="winning_post"}}')

    eventually(lambda: relayed() == PROOFS, 30, "the relayed engine metrics caught up",
               lambda: str(promql(prometheus, 'up')))
    assert single_value(prometheus, f'vastmgr_host_up{{host="{name}"}}') == 1
    assert single_value(prometheus, f'vastmgr_host_state{{host="{name}", state="running"}}') == 1
    assert single_value(prometheus, 'vastmgr_hosts{state="running", connection="live"}') == 1
    assert single_value(prometheus, 'vastmgr_backlog_jobs{kind="winning-post"}') == 0
    eventually(lambda: single_value(prometheus, f'vastmgr_proofs_total{{host="{name}", '
                                                f'kind="winning-post", status="done"}}') == PROOFS,
               10, "the dashboard's proofs counted")
    # A query may read the scrape before the one the line above read: wait for it too.
    eventually(lambda: single_value(
        prometheus, 'vastmgr_proof_duration_seconds_count{kind="winning-post"}') == PROOFS,
        10, "every proof's duration in the histogram")
    assert single_value(prometheus, 'sum(vastmgr_controller_tick_seconds_count)') > 0
    assert single_value(prometheus, 'sum(vastmgr_fanout_latency_seconds_count)') > 0
    # Events from the database: the SRS preload's, counted once.
    assert single_value(prometheus, 'vastmgr_events_total{event_kind="srs", level="info"}') == 1
    # The relayed series and the direct scrape agree on every engine sample they share.
    for metric in ("cuzk_gpu_workers", "cuzk_memory_bytes", "cuzk_proofs_failed_total"):
        direct_values = {json.dumps({k: v for k, v in r["metric"].items()
                                     if k not in ("job", "instance", "host")}, sort_keys=True):
                         r["value"][1] for r in promql(prometheus, f'{metric}{{job="engine-direct"}}')}
        relayed_values = {json.dumps({k: v for k, v in r["metric"].items()
                                      if k not in ("job", "instance", "host")}, sort_keys=True):
                          r["value"][1] for r in promql(prometheus,
                                                        f'{metric}{{host="{name}"}}')}
        assert relayed_values == direct_values, metric
    # The rules loaded and evaluate (nothing fires on a healthy fleet).
    with urllib.request.urlopen(f"{prometheus}/api/v1/rules", timeout=5) as response:
        groups = json.load(response)["data"]["groups"]
    assert {rule["name"] for g in groups for rule in g["rules"]} >= {
        "VastmgrHostOffline", "VastmgrEngineRestarting"}
    assert all(rule["health"] == "ok" for g in groups for rule in g["rules"]), groups
    assert promql(prometheus, 'ALERTS{alertstate="firing"}') == []


@pytest.fixture
def browser_page():
    from playwright.sync_api import sync_playwright

    from tests.vastmgr.browser.test_browser import CHROMIUM_ARGS

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(ignore_https_errors=True,
                                          viewport={"width": 1400, "height": 900})
            page = context.new_page()
            sockets: list[str] = []
            page.on("websocket", lambda ws: sockets.append(ws.url))
            yield page, sockets
        finally:
            browser.close()
