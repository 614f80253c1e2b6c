"""The Farm node agent."""
