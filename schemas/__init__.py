"""The contract: Arrow schemas, typed request/response records, config models."""
