"""The supervisor: node config, the model runtimes and their worker pools, the watchdog, the HTTP app, the gRPC
service, the repository, the control API, metrics and TLS.  Imports every layer below it."""
