"""MINISERVE_REDIS_URL in both forms: parsing, settings errors, and the Celery options."""
import pytest
from redis.sentinel import SentinelConnectionPool

from core.redis_conn import RedisUrlError, celery_redis_options, parse_redis_url, redis_client
from core.settings import SettingsError, load_settings


def test_plain_url_passes_through():
    target = parse_redis_url("redis://10.0.0.5:6380/2")
    assert not target.is_sentinel and target.url == "redis://10.0.0.5:6380/2"


def test_sentinel_list_with_db_and_password():
    target = parse_redis_url("sentinel://:s3cret@h1:26379;sentinel://h2:26380/3", "cache")
    assert target.sentinels == (("h1", 26379), ("h2", 26380))
    assert (target.master_name, target.db, target.password) == ("cache", 3, "s3cret")


@pytest.mark.parametrize("url", ["localhost:6379", "sentinel://h1:26379;redis://h2:6379", "sentinel://h1:x"])
def test_bad_urls_are_start_errors_naming_the_variable(url):
    with pytest.raises(SettingsError, match="MINISERVE_REDIS_URL"):
        load_settings(redis_url=url)


def test_sentinel_needs_a_master_name():
    with pytest.raises(RedisUrlError):
        parse_redis_url("sentinel://h1:26379", "")


def test_celery_options_carry_the_master_name_to_broker_and_backend():
    settings = load_settings(redis_url="sentinel://h1:26379;sentinel://h2:26379", redis_sentinel_master="m1")
    conf = celery_redis_options(settings, {"visibility_timeout": 9})
    assert conf["broker_url"] == settings.redis_url
    assert conf["broker_transport_options"]["master_name"] == "m1"
    assert conf["broker_transport_options"]["visibility_timeout"] == 9
    assert conf["result_backend_transport_options"] == {"master_name": "m1"}
    plain = celery_redis_options(load_settings(redis_url="redis://h:1/0"), {"visibility_timeout": 9}, backend=False)
    assert plain == {"broker_url": "redis://h:1/0", "broker_transport_options": {"visibility_timeout": 9}}


def test_sentinel_client_asks_the_sentinels_for_the_master():
    settings = load_settings(redis_url="sentinel://127.0.0.1:1/4", redis_sentinel_master="m1")
    client = redis_client(settings, decode_responses=True)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "m1" and pool.connection_kwargs["db"] == 4
