"""``gpufeed bench storage`` on a tiny generated set: it starts its own S3 server, reads both sources, prints the verdict."""

from __future__ import annotations

import pytest

from gpufeed.bench.storage import print_storage_result, run_storage_bench
from gpufeed.core._storage import ENV_BLOCK_BYTES, ENV_CACHE_DIR, ENV_CACHE_MAX_BYTES

pytestmark = [pytest.mark.live, pytest.mark.timeout(600)]


def test_bench_storage_reads_both_sources_and_counts_bytes_per_clip(tmp_path, capsys, monkeypatch):
    for name in (ENV_CACHE_DIR, ENV_CACHE_MAX_BYTES, ENV_BLOCK_BYTES):
        monkeypatch.delenv(name, raising=False)  # the run configures storage; later tests get it back unset
    blocks = tmp_path / "blocks"
    result = run_storage_bench(
        videos=1,
        seconds=8,
        video_size=128,
        clips=16,
        bytes_clips=8,
        rounds=1,
        workers=1,
        batch_size=4,
        cache=tmp_path,
        storage_cache_dir=blocks,
    )
    assert result["server"] == "moto on 127.0.0.1" and result["url"].startswith("s3://")
    # The timed rounds filled the disk cache; the bytes pass still counts what a clip fetches from the store.
    assert any(blocks.rglob("*")) and result["storage_cache"] == str(blocks)
    assert set(result["clips_per_s"]) == {"local disk", "object storage"}
    assert all(rate > 0 for rate in result["clips_per_s"].values())
    fetched = result["fetched"]
    # A clip fetches blocks around its GOP; kept open, later clips of the file reuse the blocks in memory.
    assert 0 < fetched["warm"]["bytes_per_clip"] <= fetched["cold"]["bytes_per_clip"]
    assert fetched["cold"]["requests_per_clip"] >= 1
    print_storage_result(result)
    out = capsys.readouterr().out
    assert "bytes fetched per clip" in out and "target >= 0.8x" in out and "load average" in out
    assert f"storage cache: {blocks}" in out
