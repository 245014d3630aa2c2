"""The run lifecycle: build the objects from the config, evaluate, train, summarise; resume, tracking, sweeps."""
