"""Authentication and authorisation: TLS and SASL on the listeners, the principal a connection
acts as, ACLs with Kafka's StandardAuthorizer semantics, SCRAM credentials and client quotas."""
