"""The socket server (Kafka's SocketServer)."""
