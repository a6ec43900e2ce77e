"""The trigger-lag benchmark harness, and the throwaway PostgreSQL it shares with the tests."""
