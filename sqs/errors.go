package sqs

import (
	"fmt"
	"net/http"
)

// errCode is one SQS error: its name in the JSON protocol (the __type
// after "#", which SDKs turn into a typed error), its code in the query
// protocol (<Code>, also sent to JSON clients in X-Amzn-Query-Error, from
// which SDKs take ErrorCode()), and its HTTP status. Every error this
// package answers is one of these; nothing matches on message text.
type errCode struct {
	json, query string
	status      int
}

var (
	codeQueueDoesNotExist     = errCode{"QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue", 400}
	codeQueueNameExists       = errCode{"QueueNameExists", "QueueAlreadyExists", 400}
	codeReceiptHandleInvalid  = errCode{"ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid", 400}
	codeMessageNotInflight    = errCode{"MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight", 400}
	codeInvalidParameterValue = errCode{"InvalidParameterValue", "InvalidParameterValue", 400}
	codeMissingParameter      = errCode{"MissingParameter", "MissingParameter", 400}
	codeInvalidAttributeName  = errCode{"InvalidAttributeName", "InvalidAttributeName", 400}
	codeInvalidAttributeValue = errCode{"InvalidAttributeValue", "InvalidAttributeValue", 400}
	codeInvalidMessage        = errCode{"InvalidMessageContents", "InvalidMessageContents", 400}
	codeBatchIDsNotDistinct   = errCode{"BatchEntryIdsNotDistinct", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400}
	codeTooManyEntries        = errCode{"TooManyEntriesInBatchRequest", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest", 400}
	codeEmptyBatch            = errCode{"EmptyBatchRequest", "AWS.SimpleQueueService.EmptyBatchRequest", 400}
	codeInvalidBatchEntryID   = errCode{"InvalidBatchEntryId", "AWS.SimpleQueueService.InvalidBatchEntryId", 400}
	codeBatchTooLong          = errCode{"BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong", 400}
	codeUnsupported           = errCode{"UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation", 400}
	codeResourceNotFound      = errCode{"ResourceNotFoundException", "ResourceNotFoundException", 404}
	codeInvalidAddress        = errCode{"InvalidAddress", "InvalidAddress", 404}
	codeInvalidAction         = errCode{"InvalidAction", "InvalidAction", 400}
	codeMissingAction         = errCode{"MissingAction", "MissingAction", 400}
	codeMalformedQuery        = errCode{"MalformedQueryString", "MalformedQueryString", 400}
	codeSerialization         = errCode{"SerializationException", "SerializationException", 400}
	codeRequestTooLarge       = errCode{"RequestEntityTooLarge", "RequestEntityTooLarge", 413}

	// Authentication and authorization (docs/security.md, "SQS").
	codeMissingAuth       = errCode{"MissingAuthenticationToken", "MissingAuthenticationToken", 403}
	codeIncompleteSig     = errCode{"IncompleteSignature", "IncompleteSignature", 400}
	codeInvalidClientID   = errCode{"InvalidClientTokenId", "InvalidClientTokenId", 403}
	codeSignatureMismatch = errCode{"SignatureDoesNotMatch", "SignatureDoesNotMatch", 403}
	codeRequestExpired    = errCode{"RequestExpired", "RequestExpired", 400}
	codeAccessDenied      = errCode{"AccessDenied", "AccessDenied", 403}
	codeThrottled         = errCode{"RequestThrottled", "RequestThrottled", 400}
	codeOriginNotAllowed  = errCode{"AccessDenied", "AccessDenied", 403}

	// The router's own conditions.
	codeUnavailable = errCode{"ServiceUnavailable", "ServiceUnavailable", 503}
	codeInternal    = errCode{"InternalFailure", "InternalError", 500}
)

// apiError is an error answer.
type apiError struct {
	code       errCode
	message    string
	retryAfter int // seconds; 0: no Retry-After
}

func (e *apiError) Error() string { return e.code.query + ": " + e.message }

func errf(code errCode, format string, a ...any) *apiError {
	return &apiError{code: code, message: fmt.Sprintf(format, a...)}
}

func errInvalidAction(a string) *apiError {
	return errf(codeInvalidAction, "the action %s is not valid for this endpoint", a)
}

func errUnavailable(what string, err error) *apiError {
	e := errf(codeUnavailable, "%s: a cluster did not answer; retry later (%v)", what, err)
	e.retryAfter = 1
	return e
}

// status is the HTTP status of e.
func (e *apiError) statusCode() int {
	if e.code.status == 0 {
		return http.StatusBadRequest
	}
	return e.code.status
}
