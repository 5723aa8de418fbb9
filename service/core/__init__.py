"""Settings, database and authentication shared by the API."""
