"""The socket server (Kafka's SocketServer).

``server``   accepts connections; per connection, requests in order, responses in order
``frames``   a connection's protocol: frames read with few copies, responses written
"""
