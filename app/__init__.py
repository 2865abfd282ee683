"""tunebench's application: the headless core (config, runs, load, telemetry) and, in
``app.gui``, the Qt front end. Only ``app.gui`` imports Qt."""
