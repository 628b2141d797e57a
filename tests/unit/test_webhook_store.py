"""Webhook deliveries in Redis (fakeredis): claims, at most one POST per try id, retries,
dead letters and replay; the target rules; the signature as the standardwebhooks package
verifies it."""
import base64
import json
import time

import fakeredis
import pytest
from standardwebhooks.webhooks import Webhook

from core import keys, webhook_sign
from core.events import SUCCEEDED
from core.jobs import JobStore
from core.webhook_target import TargetRefused, check
from core.webhooks import DEAD, DELIVERED, RETRYING, NotDead, WebhookStore, backoff_s, message_id

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123").decode()


@pytest.fixture
def jobs():
    return JobStore(fakeredis.FakeRedis(decode_responses=True), ttl_s=60)


def ended_job(jobs: JobStore, owner: str = "o1") -> str:
    job = jobs.create("generate", "generation", {}, owner=owner, webhook_url="http://hooks.example/x")
    jobs.start_attempt(job.id, "w1", lease_s=30)
    jobs.finish(job.id, SUCCEEDED, {"text": "x"}, attempt=1)
    return job.id


def test_one_claimer_wins_each_try_and_a_try_is_marked_once(jobs):
    hooks = WebhookStore(jobs.client, ttl_s=60, max_tries=3, claim_s=30)
    job_id = ended_job(jobs)
    sent = []
    assert [c.try_id for c in hooks.dispatch(lambda *a: sent.append(a))] == ["1.1"]
    assert hooks.dispatch(lambda *a: sent.append(a)) == []  # claimed: not due again until claim_s
    assert sent == [(job_id, 1, 1)]
    claimed = hooks.claim(job_id, now=time.time() + 31)  # the claim ran out: a new try
    assert claimed.try_id == "1.2"
    assert hooks.mark_try(claimed) and not hooks.mark_try(claimed)  # a re-delivered message: no 2nd POST


def test_failures_retry_then_dead_letter_then_replay(jobs):
    hooks = WebhookStore(jobs.client, ttl_s=60, max_tries=2, claim_s=30)
    job_id = ended_job(jobs)
    first = hooks.claim(job_id)
    assert hooks.report(first, False, {"status": 500}, retry_at=time.time() + 100) == RETRYING
    assert hooks.claim(job_id) is None  # not due yet
    second = hooks.claim(job_id, now=time.time() + 101)
    assert second.try_no == 2
    assert hooks.report(second, False, {"error": "ConnectionRefusedError"}, retry_at=None) == DEAD
    assert jobs.client.zscore(keys.WEBHOOK_OUTBOX, job_id) is None
    [dead] = hooks.dead()
    assert dead["job_id"] == job_id and dead["tries"] == 2 and dead["state"] == DEAD
    assert dead["last_answer"] == {"error": "ConnectionRefusedError"} and "owner" not in dead
    assert hooks.dead(owner="someone else") == []
    with pytest.raises(NotDead):
        hooks.replay(job_id, owner="someone else")
    assert hooks.replay(job_id, owner="o1") == 2
    with pytest.raises(NotDead):
        hooks.replay(job_id)  # no longer dead
    again = hooks.claim(job_id)
    assert again.try_id == "2.1" and hooks.mark_try(again)
    assert hooks.report(again, True, {"status": 204}, retry_at=None) == DELIVERED
    assert hooks.dead() == [] and jobs.client.zcard(keys.WEBHOOK_OUTBOX) == 0


def test_a_claim_past_the_last_try_dead_letters_without_sending(jobs):
    hooks = WebhookStore(jobs.client, ttl_s=60, max_tries=1, claim_s=10)
    job_id = ended_job(jobs)
    assert hooks.claim(job_id).try_no == 1  # its worker died before it could report
    assert hooks.claim(job_id, now=time.time() + 11) is None
    assert [d["job_id"] for d in hooks.dead()] == [job_id]


def test_backoff_doubles_up_to_its_cap():
    assert [backoff_s(n, 10, 60) for n in (1, 2, 3, 4, 5)] == [10, 20, 40, 60, 60]


def fixed(*addresses):
    return lambda host, port: list(addresses)


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "192.168.0.9", "172.16.4.4", "169.254.169.254",
                                     "0.0.0.0", "224.0.0.1", "240.0.0.1", "100.64.0.1", "::1", "fe80::1",
                                     "fc00::1", "::ffff:127.0.0.1", "ff02::1"])
def test_private_loopback_link_local_multicast_and_reserved_targets_are_refused(address):
    with pytest.raises(TargetRefused):
        check("https://hooks.example/x", resolver=fixed(address))


def test_every_address_is_checked_and_allowed_hosts_pass():
    with pytest.raises(TargetRefused):
        check("https://hooks.example/x", resolver=fixed("93.184.216.34", "10.0.0.1"))
    target = check("http://hooks.example:8080/a?b=1", resolver=fixed("93.184.216.34"))
    assert (target.host, target.port, target.path, target.addresses) == ("hooks.example", 8080, "/a?b=1",
                                                                          ("93.184.216.34",))
    assert check("http://127.0.0.1:9/x", allow_hosts=("127.0.0.1",)).addresses == ("127.0.0.1",)
    assert check("http://localhost:9/x", allow_hosts=("127.0.0.1", "::1"), resolver=fixed("127.0.0.1", "::1"))


@pytest.mark.parametrize("url", ["ftp://hooks.example/x", "file:///etc/passwd", "http://", "hooks.example/x",
                                 "http://user:pw@hooks.example/", "http://hooks.example:99999/",
                                 "http://hooks.example/" + "a" * 3000, "gopher://hooks.example/"])
def test_malformed_and_non_http_urls_are_refused(url):
    with pytest.raises(TargetRefused):
        check(url, resolver=fixed("93.184.216.34"))


def test_signature_verifies_with_the_standardwebhooks_package():
    body = json.dumps({"id": "a" * 32, "state": "succeeded"}).encode()
    now = int(time.time())
    headers = webhook_sign.headers(SECRET, message_id("a" * 32), now, body)
    assert Webhook(SECRET).verify(body, headers) == {"id": "a" * 32, "state": "succeeded"}
    with pytest.raises(Exception):
        Webhook(SECRET).verify(body + b" ", headers)


@pytest.mark.parametrize("secret", ["", "secret", "whsec_not base64!", "whsec_" + base64.b64encode(b"short").decode()])
def test_bad_secrets_are_refused(secret):
    with pytest.raises(ValueError):
        webhook_sign.secret_bytes(secret)
