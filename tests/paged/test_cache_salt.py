"""Cache isolation: a salt (the job's cache scope: its key's owner id, or a request's salt)
roots every chain, so two scopes share no block, and the web's routing key follows the salt."""
from core.prefix_hash import ROOT_HASH, block_hashes, cache_scope, salted_root
from engine.paged import BlockManager
from web.routing import PrefixKeyer, format_key

BS = 4
PROMPT = list(range(100, 112)) + [1, 2, 3]   # three full blocks, then a partial one


def run(m: BlockManager, seq_id, tokens, salt: str = "") -> int:
    cached = m.allocate(seq_id, tokens, root=salted_root(salt))
    m.commit(seq_id)
    return cached


def test_two_keys_with_the_same_prompt_share_no_block():
    m = BlockManager(32, BS)
    assert run(m, "a1", PROMPT, salt="owner-a") == 0
    assert run(m, "b1", PROMPT, salt="owner-b") == 0          # b learns nothing of a's prompt
    assert m.cached_prefix_tokens(PROMPT, root=salted_root("owner-c")) == 0
    assert not set(m.block_table("a1")) & set(m.block_table("b1"))
    assert run(m, "a2", PROMPT, salt="owner-a") == 12          # within one key it is shared
    assert m.block_table("a2")[:3] == m.block_table("a1")[:3]


def test_no_salt_is_the_unsalted_chain_as_before():
    assert salted_root("") == ROOT_HASH
    m = BlockManager(32, BS)
    assert run(m, "x", PROMPT) == 0 and run(m, "y", PROMPT) == 12


def test_the_scope_is_the_owner_unless_shared_and_adds_a_request_salt():
    assert cache_scope("owner-a", shared_across_keys=False) == "owner-a"
    assert cache_scope("owner-a", shared_across_keys=True) == ""
    assert cache_scope("owner-a", shared_across_keys=False, request_salt="s") == "owner-a|s"
    assert cache_scope("owner-a", shared_across_keys=True, request_salt="s") == "s"
    assert cache_scope("", shared_across_keys=False) == ""      # no keys configured: one scope


def test_the_web_routing_key_is_the_salted_blocks_hash():
    """Routing by prefix still works within a key: the web's key is the last block hash its
    worker's block manager publishes for the same salt, and differs across keys."""
    keyer = PrefixKeyer(BS, min_tokens=BS)
    system = PROMPT[:12]
    m = BlockManager(32, BS)
    run(m, "a", PROMPT, salt="owner-a")
    key_a, covered = keyer.key(system, salt="owner-a")
    assert covered == 12 and key_a == format_key(m._seqs["a"].hashes[2])
    assert keyer.key(system, salt="owner-b")[0] != key_a
    assert block_hashes(system, BS, root=salted_root("owner-a"))[-1] == m._seqs["a"].hashes[2]
