// Package sdktest drives the router's SQS API (package sqs) through real
// SQS clients: the AWS SDK for Go v2 (JSON protocol) in its Go tests, and
// Debian's AWS CLI and boto3 (query protocol) in testdata/e2e.sh and
// testdata/e2e.py, which TestQueryProtocolClients runs. It is a Go module
// of its own, so that the product's go.mod does not depend on the AWS SDK
// (about fifteen modules) for tests; `make test-sqs` runs it.
package sdktest
