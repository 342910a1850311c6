"""The SQS API through boto3 (Debian's python3-boto3: the query protocol).

Run by TestQueryProtocolClients against a router over the test bed, with
SQS_ENDPOINT set and AWS_SHARED_CREDENTIALS_FILE holding the profiles
"default" (an admin key) and "producer" (a produce-only key). Every action
boto3 1.26 knows; StartMessageMoveTask and ListMessageMoveTasks are newer
than it and are covered by the Go SDK's tests.
"""
import os
import threading

import boto3
import botocore.exceptions

ENDPOINT = os.environ["SQS_ENDPOINT"]
checks = 0


def client(profile="default", secret=None):
    s = boto3.session.Session(profile_name=profile, region_name="us-east-1")
    if secret is not None:
        creds = s.get_credentials()
        return boto3.client("sqs", endpoint_url=ENDPOINT, region_name="us-east-1",
                            aws_access_key_id=creds.access_key, aws_secret_access_key=secret)
    return s.client("sqs", endpoint_url=ENDPOINT)


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        raise AssertionError(what)


def expect_error(code, fn, **kw):
    try:
        fn(**kw)
    except botocore.exceptions.ClientError as e:
        got = e.response["Error"]["Code"]
        check(got == code, "want error %s, got %s (%s)" % (code, got, e))
        return
    raise AssertionError("want error %s, got none" % code)


sqs = client()

# Queues: create (idempotent), URL, listing, attributes, tags.
url = sqs.create_queue(QueueName="py-orders", Attributes={"VisibilityTimeout": "40"}, tags={"team": "ops"})["QueueUrl"]
check(url.endswith("/000000000000/py-orders"), url)
check(sqs.create_queue(QueueName="py-orders", Attributes={"VisibilityTimeout": "40"})["QueueUrl"] == url, "create again")
expect_error("QueueAlreadyExists", sqs.create_queue, QueueName="py-orders", Attributes={"VisibilityTimeout": "5"})
check(sqs.get_queue_url(QueueName="py-orders")["QueueUrl"] == url, "get_queue_url")
check(url in sqs.list_queues(QueueNamePrefix="py-")["QueueUrls"], "list_queues")
sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "0", "MaximumMessageSize": "2048"})
attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
check(attrs["VisibilityTimeout"] == "40" and attrs["MaximumMessageSize"] == "2048", attrs)
check(attrs["QueueArn"] == "arn:aws:sqs:us-east-1:000000000000:py-orders", attrs)
sqs.tag_queue(QueueUrl=url, Tags={"env": "e2e"})
sqs.untag_queue(QueueUrl=url, TagKeys=["team"])
check(sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "e2e"}, "tags")
expect_error("AWS.SimpleQueueService.NonExistentQueue", sqs.get_queue_url, QueueName="py-missing")

# Messages: attributes of every type round-trip; a message too large for
# the queue is refused.
sent = sqs.send_message(QueueUrl=url, MessageBody="hello", MessageAttributes={
    "s": {"DataType": "String", "StringValue": "text"},
    "n": {"DataType": "Number", "StringValue": "7"},
    "b": {"DataType": "Binary", "BinaryValue": b"\x00\xff"}})
check(sent["MD5OfMessageBody"] == "5d41402abc4b2a76b9719d911017c592", sent)
expect_error("InvalidParameterValue", sqs.send_message, QueueUrl=url, MessageBody="x" * 4096)
got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, AttributeNames=["All"], MessageAttributeNames=["All"])["Messages"]
m = got[0]
check(m["MessageId"] == sent["MessageId"] and m["Body"] == "hello", m)
check(m["MessageAttributes"]["b"]["BinaryValue"] == b"\x00\xff", m["MessageAttributes"])
check(m["MessageAttributes"]["n"] == {"StringValue": "7", "DataType": "Number"}, m["MessageAttributes"])
check(m["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"], "attribute digests")
check(m["Attributes"]["ApproximateReceiveCount"] == "1", m["Attributes"])

# Visibility: back at once with 0, counted; extended in a batch.
sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
m = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, AttributeNames=["ApproximateReceiveCount"])["Messages"][0]
check(m["Attributes"]["ApproximateReceiveCount"] == "2", m["Attributes"])
r = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
    {"Id": "a", "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 60},
    {"Id": "b", "ReceiptHandle": "garbage", "VisibilityTimeout": 60}])
check(len(r["Successful"]) == 1 and r["Failed"][0]["Code"] == "ReceiptHandleIsInvalid", r)
check("Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1), "invisible after extension")
sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
expect_error("ReceiptHandleIsInvalid", sqs.delete_message, QueueUrl=url, ReceiptHandle="garbage")

# Batches.
entries = [{"Id": "e%d" % i, "MessageBody": "m%d" % i} for i in range(9)] + [{"Id": "bad", "MessageBody": "\x01"}]
r = sqs.send_message_batch(QueueUrl=url, Entries=entries)
check(len(r["Successful"]) == 9 and r["Failed"][0]["Id"] == "bad" and r["Failed"][0]["SenderFault"], r)
expect_error("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", sqs.send_message_batch, QueueUrl=url,
             Entries=[{"Id": "x", "MessageBody": "1"}, {"Id": "x", "MessageBody": "2"}])
expect_error("AWS.SimpleQueueService.TooManyEntriesInBatchRequest", sqs.send_message_batch, QueueUrl=url,
             Entries=[{"Id": "x%d" % i, "MessageBody": "1"} for i in range(11)])
handles = []
while len(handles) < 9:
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=5).get("Messages", [])
    check(got, "received %d of 9" % len(handles))
    handles += [g["ReceiptHandle"] for g in got]
r = sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": "d%d" % i, "ReceiptHandle": h} for i, h in enumerate(handles)])
check(len(r["Successful"]) == 9 and not r.get("Failed"), r)

# FIFO: two groups interleaved keep their order, one in flight per group;
# a repeated deduplication id is stored once.
fifo = sqs.create_queue(QueueName="py-jobs.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
for i in range(3):
    for g in ("a", "b"):
        sqs.send_message(QueueUrl=fifo, MessageBody="%s%d" % (g, i), MessageGroupId=g, MessageDeduplicationId="%s%d" % (g, i))
dup = sqs.send_message(QueueUrl=fifo, MessageBody="other body", MessageGroupId="a", MessageDeduplicationId="a0")
check("SequenceNumber" in dup, dup)
seen = {"a": [], "b": []}
while len(seen["a"]) + len(seen["b"]) < 6:
    got = sqs.receive_message(QueueUrl=fifo, MaxNumberOfMessages=10, WaitTimeSeconds=5, AttributeNames=["MessageGroupId"]).get("Messages", [])
    check(got, "fifo stalled at %s" % seen)
    groups = [g["Attributes"]["MessageGroupId"] for g in got]
    check(len(groups) == len(set(groups)), "two of one group in flight: %s" % groups)
    for g in got:
        seen[g["Attributes"]["MessageGroupId"]].append(g["Body"])
        sqs.delete_message(QueueUrl=fifo, ReceiptHandle=g["ReceiptHandle"])
check(seen == {"a": ["a0", "a1", "a2"], "b": ["b0", "b1", "b2"]}, seen)
check("Messages" not in sqs.receive_message(QueueUrl=fifo, WaitTimeSeconds=1), "the duplicate was delivered")

# Dead letters: after maxReceiveCount receives the message is the
# dead-letter queue's; purging that queue removes it.
dlq = sqs.create_queue(QueueName="py-dlq", Attributes={"VisibilityTimeout": "0"})["QueueUrl"]
src = sqs.create_queue(QueueName="py-work", Attributes={"VisibilityTimeout": "0", "RedrivePolicy":
                       '{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:py-dlq","maxReceiveCount":"2"}'})["QueueUrl"]
sqs.send_message(QueueUrl=src, MessageBody="poison")
for i in (1, 2):
    got = sqs.receive_message(QueueUrl=src, WaitTimeSeconds=5).get("Messages", [])
    check(len(got) == 1, "receive %d" % i)
check("Messages" not in sqs.receive_message(QueueUrl=src, WaitTimeSeconds=1), "received past maxReceiveCount")
check(sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [src], "dead-letter sources")
got = sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=5, AttributeNames=["All"])["Messages"]
check(got[0]["Body"] == "poison" and got[0]["Attributes"]["DeadLetterQueueSourceArn"].endswith(":py-work"), got)
sqs.purge_queue(QueueUrl=dlq)
check(sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]["ApproximateNumberOfMessages"] == "0", "purged")

# Long poll: a waiting receive wakes with a message sent meanwhile.
poll = sqs.create_queue(QueueName="py-poll")["QueueUrl"]
answer = {}
waiting = threading.Event()


def receive():
    waiting.set()
    answer["r"] = client().receive_message(QueueUrl=poll, WaitTimeSeconds=20)


t = threading.Thread(target=receive)
t.start()
waiting.wait()
sqs.send_message(QueueUrl=poll, MessageBody="wake")
t.join()
check(answer["r"]["Messages"][0]["Body"] == "wake", answer)

# Signatures: a wrong secret, and a produce-only key receiving.
expect_error("SignatureDoesNotMatch", client(secret="w" * 40).list_queues)
producer = client("producer")
producer.send_message(QueueUrl=url, MessageBody="from a producer")
expect_error("AccessDenied", producer.receive_message, QueueUrl=url)

sqs.delete_queue(QueueUrl=url)
expect_error("AWS.SimpleQueueService.NonExistentQueue", sqs.get_queue_url, QueueName="py-orders")
print("e2e.py: ok, %d checks" % checks)
