"""What the tests share (not collected as tests): ``nodes`` (generous node configs, ``started`` and the conftest's
``start_node`` fixture: a node that is always stopped), ``http`` and ``grpc_client`` (requests to a node on
loopback, every answer and timeout explicit), ``models`` (tiny models and their in-process scores), ``oip_inputs``,
``scrape`` (``/metrics`` as Prometheus reads it), ``proc_net``, ``ports``, ``h2_transport``, ``planner_fixtures``."""
