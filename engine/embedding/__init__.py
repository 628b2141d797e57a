"""The second kind of model: sentence embeddings (a BERT-style encoder, pooled and normalized).

``source`` finds and verifies the bundled model's files, ``model`` runs the encoder and the
pooling its sentence-transformers config asks for, ``batcher`` is the one thread that owns
the loaded model and runs the inputs of concurrent requests together. Nothing here knows of
Celery, Flask or Redis.
"""
