"""transform: join every batch of orders with a static RDD of customers (historical data), then
total the order amounts per country. The static RDD is built once on the driver; the function
given to transform runs on the driver for each batch, so it may use it. (With a checkpoint the
function is saved and must not capture an RDD: load the table inside the function instead.)

    python examples/programs/transform_join.py
"""

from engine import StreamingContext, local_spark_context, run_batches

CUSTOMERS = [("ada", "UK"), ("bob", "US"), ("chen", "CN"), ("dora", "US")]
ORDERS = [
    [("ada", 20), ("bob", 5), ("bob", 7)],
    [("chen", 12), ("dora", 3), ("eve", 99)],  # eve is no known customer: the join drops her
    [("ada", 1), ("chen", 2), ("dora", 4), ("bob", 1)],
]
BATCHES = len(ORDERS)

if __name__ == "__main__":
    sc = local_spark_context("transform-join")
    ssc = StreamingContext(sc, 0.5)
    customers = sc.parallelize(CUSTOMERS).cache()
    orders = ssc.queueStream([sc.parallelize(batch) for batch in ORDERS])
    by_country = orders.transform(lambda rdd: rdd.join(customers).values())
    by_country.map(lambda amount_country: (amount_country[1], amount_country[0])).reduceByKey(
        lambda a, b: a + b
    ).pprint()
    run_batches(ssc, BATCHES)
