"""Jobs: durable records, the status machine, and the service every front end goes through.

- :mod:`~trainport.jobs.status`: statuses and the pure transition function;
- :mod:`~trainport.jobs.records`: the job record and its DescribeTrainingJob view;
- :mod:`~trainport.jobs.db`: SQLite persistence under TRAINPORT_HOME;
- :mod:`~trainport.jobs.service`: the one door (create, describe, list, stop, logs);
- :mod:`~trainport.jobs.supervisor`: the process that owns one running job.
"""
