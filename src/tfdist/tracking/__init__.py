"""Tracking: where runs, metrics and models are kept, and what happens when that store fails.

The modules divide the work by concern:

- :mod:`~tfdist.tracking.store`: a store's URI, checked in seconds, before MLflow is imported;
- :mod:`~tfdist.tracking.schema`: a new sqlite store, copied from MLflow's migrated schema;
- :mod:`~tfdist.tracking.experiment`: MLflow pointed at the store and the experiment, under a lock;
- :mod:`~tfdist.tracking.runs`: an execution's parent run, a stage's run, its params, metrics, tags, datasets;
- :mod:`~tfdist.tracking.models`: models saved, logged, registered, checked and loaded, and the champion;
- :mod:`~tfdist.tracking.addresses`: the UI's pages of an execution's runs;
- :mod:`~tfdist.tracking.outage`: the chief's writes while the store does not answer;
- :mod:`~tfdist.tracking.object_store`: a team's S3 bucket, checked in seconds;
- :mod:`~tfdist.tracking.server_app`: MLflow's server with the UI opening training runs;
- :mod:`~tfdist.tracking.server_doors`: which Host, Origin and features that server answers;
- :mod:`~tfdist.tracking.mlflow_private`: every use of MLflow's private API, each with a test.

This package's ``__init__`` imports nothing, so that probing a store
(:mod:`~tfdist.tracking.store`, :mod:`~tfdist.tracking.object_store`) never
pays for ``import mlflow`` (docs/performance.md, "Start-up").
"""
