"""The `flightdeck` command: serve, worker, client commands and the tiny-model builders."""
