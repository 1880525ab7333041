"""Other engines driving vitpose: `vitpose.integrations.ray` (Ray Data; extra `.[ray]`)."""
