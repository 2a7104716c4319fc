class PoolingParams:
    def __init__(self, **values):
        self.__dict__.update(values)
