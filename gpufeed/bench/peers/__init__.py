"""Baselines for ``gpufeed bench server``: the servers people write instead of gpufeed's.

* :mod:`.plain`: FastAPI + PIL + onnxruntime, one inference per request (the hand-written server).
* :mod:`.litserve_peer`: LitServe with its dynamic batching, PIL decoding in ``decode_request``.

Each runs as its own process (``python -m gpufeed.bench.peers.plain --model-dir D --port P``) and
answers ``POST /predict`` with a multipart ``image`` file, as gpufeed's REST endpoint does, so one
client drives all three with the same bytes. They live here, not in ``server/``: they are
yardsticks, not product.
"""
