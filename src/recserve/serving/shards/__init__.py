"""ElasticRec sharded serving: embedding-shard services and the remote tables a dense shard calls."""
