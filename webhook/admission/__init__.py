"""The admission protocol: the AdmissionReview codec, the handlers of each endpoint, their
configuration, and the port through which they ask the quota decider."""
