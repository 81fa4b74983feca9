"""gRPC server: servicer (conversion), interceptors (auth, request ids, errors), admission, metrics."""
