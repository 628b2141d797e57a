"""The AVX2 verify-row price, A/B: ``python scripts/speculative_row_cost_ab.py 0.10`` then ``0.50``.

Runs ``bench.speculative`` (q8, the first 4 prompts of each kind, a loop of 8 jobs) with the
draft budget's AVX2 row price set to the given value (0.10 is the AVX512-VNNI kernel's);
writes ``results/avx2/speculative_row_cost_<price>.{csv,json,png}``. On an AVX-512 CPU the
override has no effect (the price is looked up by the kernel's vector path).
"""
import sys

import engine.speculative.config as config

price = sys.argv[1]
config.ROW_COST_Q8_BY_PATH["avx2"] = float(price)
import bench.speculative as spec  # noqa: E402 - after the override

spec.main(["--quant", "q8", "--limit", "4", "--batch-rounds", "1", "--queue-jobs", "8", "--batch1-repeats", "3",
           "--out", f"results/avx2/speculative_row_cost_{price.replace('.', 'p')}"])
